"""`kiln doctor TARGET [--input SPEC] [--train] [--mode M] [--stages ...] [--backend B] [--json FILE]`."""

from __future__ import annotations

import argparse
import sys

from kiln.cli.args import add_verbose_flag
from kiln.cli.explain_cmd import emit
from kiln.config.options import add_flags, from_namespace
from kiln.diagnose.diagnose_request import DoctorRequest


def add_parser(sub) -> None:
    p = sub.add_parser(
        "doctor",
        help="run a model under eager, aot_eager, aot_eager_decomp_partition, inductor and name the first stage "
             "that crashes or drifts",
        description="Run the target under each torch.compile stage, compare outputs (and gradients with --train) "
        "with eager and a float64 reference by the dynamo benchmark harness rule, and name the first stage that "
        "crashes or drifts; bisect inductor failures and write a repro script. Exit status: 0 when every stage "
        "passes, 1 when one fails.",
    )
    add_verbose_flag(p)
    add_flags(p, DoctorRequest)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.diagnose.console import render_doctor
    from kiln.diagnose.diagnose_command import doctor_command

    request = from_namespace(DoctorRequest, args)
    report = doctor_command(request)
    emit(report, request.json, render_doctor)
    first = report["first_failure"]
    if first is not None:
        print(f"kiln: doctor: first failure at stage {first['backend']} ({first['status']}): {first['error']}",
              file=sys.stderr)
        return 1
    return 0
