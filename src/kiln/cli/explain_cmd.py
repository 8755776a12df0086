"""`kiln explain TARGET [--input SPEC] [--inputs-from FILE] [--train] [--vary ...] [--fullgraph-check] [--json FILE]`.

Also holds the report output that `kiln doctor` shares.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kiln.cli.args import add_verbose_flag
from kiln.config.options import add_flags, from_namespace
from kiln.diagnose.diagnose_request import ExplainRequest


def emit(report: dict[str, Any], json_path: str | None, render) -> None:
    """Write the JSON (if asked) and show the rich report (unless the JSON went to stdout)."""
    if json_path == "-":
        print(json.dumps(report, indent=2, default=str))
        return
    if json_path:
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    import os

    from rich.console import Console

    # Reports are wide tables: when piped (80 columns by default) give them room unless COLUMNS says.
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    Console(width=140 if wide else None).print(render(report))
    if json_path:
        print(f"kiln: wrote {json_path}")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "explain",
        help="graph breaks (where, why, fix), recompiles and ops per graph of torch.compile on a model",
        description="Explain what torch.compile does with a model: graphs, graph breaks with the user's file:line "
        "and a fix, recompiles with the failing guard. Exit status: 0; with --fullgraph-check, 1 when the model "
        "cannot compile as one graph.",
    )
    add_verbose_flag(p)
    add_flags(p, ExplainRequest)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.diagnose.console import render_explain, render_fullgraph
    from kiln.diagnose.diagnose_command import explain_command

    request = from_namespace(ExplainRequest, args)
    report = explain_command(request)
    emit(report, request.json, render_fullgraph if request.fullgraph_check else render_explain)
    if request.fullgraph_check and not report["fullgraph_ok"]:
        b = report["fullgraph_blocker"] or {}
        print(f"kiln: fullgraph: no ({b.get('category')} at {b.get('file')}:{b.get('line')})", file=sys.stderr)
        return 1
    return 0
