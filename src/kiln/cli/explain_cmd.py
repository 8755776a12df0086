"""`kiln explain TARGET [--input SPEC] [--inputs-from FILE] [--train] [--vary ...] [--fullgraph-check] [--json FILE]`.

Also holds the TARGET/input arguments that `kiln doctor` shares.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

TARGET_HELP = ("registry name (mlp, vit, hf:llama-tiny), package.module:function or path/to/file.py:function; "
               "the function returns an nn.Module or (module, example_inputs), inputs being any Python values")


def add_target_args(p: argparse.ArgumentParser) -> None:
    from kiln.cli.args import add_verbose_flag

    add_verbose_flag(p)
    p.add_argument("target", metavar="TARGET", help=TARGET_HELP)
    p.add_argument("--input", action="append", metavar="SPEC", dest="inputs",
                   help="one per forward argument: 8x3x224x224, float16:4x16, int64[0,512):2x32, float=0.5")
    p.add_argument("--inputs-from", metavar="FILE",
                   help=".pt with a tensor, a tuple of inputs, or a list of input tuples (one per call), .npy, or "
                        "file.py:function returning the same as Python values (strings, dicts, dataclasses)")
    p.add_argument("--kwarg", action="append", metavar="KEY=VALUE", default=[],
                   help="keyword argument for the model factory (value parsed as JSON, else a string)")
    p.add_argument("--train", action=argparse.BooleanOptionalAction, default=None,
                   help="run forward and backward (loss = sum of the outputs); --no-train: forward only, autograd off "
                        "(explain's default: as the module's own mode says; doctor's: forward only)")
    p.add_argument("--device", default="cpu", help="device to run on (default cpu)")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON to FILE ('-' for stdout, no table)")


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
    add_target_args(p)
    p.add_argument("--vary", action="append", metavar="KIND",
                   help="input changes to provoke recompiles: batch[=4,8], dimN[=16,32], scalars, dtype, autocast "
                        "(default: batch,scalars; none with several --inputs-from sets)")
    p.add_argument("--no-vary", action="store_true", help="call with the example inputs only")
    p.add_argument("--backend", default=None,
                   help="backend behind the recorder (default eager; aot_eager with --train, to see backward graphs)")
    p.add_argument("--no-verify", action="store_true",
                   help="do not re-run the check with each mechanical fix (config flag, mark_dynamic) applied")
    p.add_argument("--fullgraph-check", action="store_true",
                   help="show only whether torch.compile(fullgraph=True) works, naming the first blocker, and exit 1 "
                        "when it does not (the full report gives the same verdict)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.diagnose.backends import resolve_backend
    from kiln.diagnose.console import render_explain, render_fullgraph
    from kiln.diagnose.explain import explain_target
    from kiln.diagnose.target import check_device, load_target, parse_kwargs
    from kiln.diagnose.vary import parse_vary

    device = check_device(args.device)
    vary = [] if args.no_vary else (parse_vary(args.vary) if args.vary else None)
    if args.backend:
        resolve_backend(args.backend)  # ConfigError (exit 2) for an unknown name
    target = load_target(args.target, parse_kwargs(args.kwarg), args.inputs, args.inputs_from)
    report = explain_target(target, backend=args.backend, train=args.train, vary=vary, device=device,
                            verify=not args.no_verify)
    emit(report, args.json, render_fullgraph if args.fullgraph_check else render_explain)
    if args.fullgraph_check and not report["fullgraph_ok"]:
        b = report["fullgraph_blocker"] or {}
        print(f"kiln: fullgraph: no ({b.get('category')} at {b.get('file')}:{b.get('line')})", file=sys.stderr)
        return 1
    return 0
