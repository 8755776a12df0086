"""`kiln export RUN_DIR [--checkpoint PATH] --out FILE.safetensors | DIR`: model weights for inference
(one safetensors file), or a Hugging Face model directory for `llama:` and `hf:` runs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kiln.cli.args import add_verbose_flag


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
                   help="FILE.safetensors to write, or a new DIR for a Hugging Face model directory (refused if it exists, "
                   "if it is, holds or lies inside RUN_DIR or --checkpoint, or inside a run dir a running kiln process "
                   "holds)")
    p.add_argument("--force", action="store_true",
                   help="replace --out if it holds an earlier kiln export (only once the new export is complete; "
                   "anything else there is refused)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_verbose_flag(p)
    p.set_defaults(run=run)


def respect_umask(out: Path) -> None:
    """Give the exported files the mode any new file gets (0666 less the umask): safetensors
    writes 0600, which hides an export from the group a run dir is shared with."""
    umask = os.umask(0)
    os.umask(umask)
    files = [p for p in out.rglob("*") if p.is_file()] if out.is_dir() else [out]
    for path in files:
        os.chmod(path, 0o666 & ~umask)


def run(args: argparse.Namespace) -> int:
    from kiln.checkpoint.export import export_safetensors
    from kiln.checkpoint.hf_export import export_hf_dir
    from kiln.outputs import refuse_held_by_another

    # A live run's dir is its own: exporting from it is fine, writing into it is not.
    refuse_held_by_another(args.out, "--out", "write the export elsewhere, or once that run has ended")
    args.out = Path(os.path.abspath(args.out))  # `--out .` names the current directory, not ""
    args.output_dir = args.out.parent  # a failure's error.log goes next to the file it was writing

    # Both check --out before any work (kiln.checkpoint.export_target): nothing already there is lost.
    if args.out.suffix == ".safetensors":
        summary = export_safetensors(args.run_dir, args.out, checkpoint=args.checkpoint, replace=args.force)
    else:
        summary = export_hf_dir(args.run_dir, args.out, checkpoint=args.checkpoint, replace=args.force)
    respect_umask(args.out)
    if args.json:
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
