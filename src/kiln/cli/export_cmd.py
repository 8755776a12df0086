"""`kiln export RUN_DIR [--checkpoint PATH] --out FILE.safetensors`: model weights for inference."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kiln.cli.main import add_verbose_flag


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export",
        help="consolidate a run's checkpoint into one safetensors file (no model code needed)",
        description="Write the model weights of RUN_DIR's newest complete checkpoint (or --checkpoint) "
        "into one safetensors file; FSDP shards are gathered. Also writes OUT's stem + .kiln_export.json.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the run directory (holds checkpoints/)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="a checkpoint directory (or its name under RUN_DIR/checkpoints); default: newest complete")
    p.add_argument("--out", type=Path, required=True, help="FILE.safetensors to write")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_verbose_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.checkpoint.export import export_safetensors

    args.output_dir = args.out.parent  # a failure's error.log goes next to the file it was writing

    summary = export_safetensors(args.run_dir, args.out, checkpoint=args.checkpoint)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"exported {summary['tensors']} tensors ({summary['parameters']:,} values) of {summary['checkpoint']} "
              f"(step {summary['step']}) to {summary['out']}")
    return 0
