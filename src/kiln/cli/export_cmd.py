"""`kiln export RUN_DIR [--checkpoint PATH] --out FILE.safetensors | DIR`: model weights for inference
(one safetensors file), or a Hugging Face model directory for `llama:` and `hf:` runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kiln.cli.main import add_verbose_flag


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export",
        help="consolidate a run's checkpoint into one safetensors file or a Hugging Face model directory",
        description="Write the model weights of RUN_DIR's newest complete checkpoint (or --checkpoint) "
        "into one safetensors file (--out FILE.safetensors; also writes OUT's stem + .kiln_export.json), or, for "
        "a run of a llama: or hf: causal LM, a Hugging Face model directory (--out DIR: config.json, "
        "model.safetensors, generation_config.json and the tokenizer files of the run's data) that "
        "transformers and `kiln generate --model DIR` load. FSDP shards are gathered.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the run directory (holds checkpoints/)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="a checkpoint directory (or its name under RUN_DIR/checkpoints); default: newest complete")
    p.add_argument("--out", type=Path, required=True,
                   help="FILE.safetensors to write, or a new DIR for a Hugging Face model directory")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_verbose_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.checkpoint.export import export_safetensors
    from kiln.checkpoint.hf_export import export_hf_dir

    args.output_dir = args.out.parent  # a failure's error.log goes next to the file it was writing

    export = export_safetensors if args.out.suffix == ".safetensors" else export_hf_dir
    summary = export(args.run_dir, args.out, checkpoint=args.checkpoint)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"exported {summary['tensors']} tensors ({summary['parameters']:,} values) of {summary['checkpoint']} "
              f"(step {summary['step']}) to {summary['out']}")
    return 0
