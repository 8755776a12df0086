"""`kiln doctor TARGET [--input SPEC] [--train] [--mode M] [--stages ...] [--backend B] [--json FILE]`."""

from __future__ import annotations

import argparse
import sys

from kiln.cli.explain_cmd import add_target_args, emit


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
    add_target_args(p)
    p.add_argument("--mode", help="also run inductor with this torch.compile mode (e.g. max-autotune)")
    p.add_argument("--stages", help="comma-separated stages instead of eager,aot_eager,aot_eager_decomp_partition,"
                                    "inductor")
    p.add_argument("--backend", action="append", default=[], metavar="NAME",
                   help="an extra stage: a registered backend name or module:function (repeatable)")
    p.add_argument("--tol", type=float, help="harness tolerance (default 1e-4; 1e-3 with --train)")
    p.add_argument("--no-bisect", action="store_true", help="do not run torch's CompilerBisector on inductor failures")
    p.add_argument("--no-repro", action="store_true", help="do not write a repro script")
    p.add_argument("--out", help="directory for the repro script (default: runs/<time>-doctor-<target>, created only "
                   "when a stage fails and a repro is written)")
    p.set_defaults(run=run)


def _out_dir(args: argparse.Namespace):
    """--out, or a new run dir named after the target: never the current directory, which may be a
    source tree (the repro's files would land among the user's own)."""
    from pathlib import Path

    from kiln.runtime import default_run_dir

    return Path(args.out) if args.out else default_run_dir(f"doctor-{args.target.rsplit(':', 1)[-1]}")


def run(args: argparse.Namespace) -> int:
    from kiln.diagnose.backends import build_ladder
    from kiln.diagnose.console import render_doctor
    from kiln.diagnose.doctor import run_doctor
    from kiln.diagnose.target import check_device, load_target, parse_kwargs

    device = check_device(args.device)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None
    build_ladder(stages, args.mode, args.backend)  # bad names exit 2 before the model is built
    target = load_target(args.target, parse_kwargs(args.kwarg), args.inputs, args.inputs_from)
    report = run_doctor(target, stages=stages, mode=args.mode, backends=args.backend, train=bool(args.train),
                        tol=args.tol, device=device, bisect=not args.no_bisect, out_dir=_out_dir(args),
                        repro=not args.no_repro)
    emit(report, args.json, render_doctor)
    first = report["first_failure"]
    if first is not None:
        print(f"kiln: doctor: first failure at stage {first['backend']} ({first['status']}): {first['error']}",
              file=sys.stderr)
        return 1
    return 0
