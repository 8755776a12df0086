"""`kiln export RUN_DIR [--checkpoint PATH] --out FILE.safetensors | DIR`: model weights for inference
(one safetensors file), or a Hugging Face model directory for `llama:` and `hf:` runs."""

from __future__ import annotations

import argparse
import json
import sys

from kiln.checkpoint.export_request import ExportRequest
from kiln.cli.args import add_verbose_flag
from kiln.config.options import add_flags, from_namespace


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
    add_flags(p, ExportRequest)
    add_verbose_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kiln.checkpoint.export_run import export_checkpoint, export_out

    request = from_namespace(ExportRequest, args)
    out = export_out(request)
    args.output_dir = out.parent  # a failure's error.log goes next to the file it was writing
    summary = export_checkpoint(request, out)
    if request.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"exported {summary['tensors']} tensors ({summary['parameters']:,} values) of {summary['checkpoint']} "
              f"(step {summary['step']}) to {summary['out']}")
        for field, ids in summary.get("special_tokens", {}).items():
            print(f"kiln: {field} {ids['tokenizer']} from the run's tokenizer (its model/config.json said "
                  f"{ids['config']})", file=sys.stderr)
        if summary.get("replaced"):
            print(summary["replaced"])
    return 0
