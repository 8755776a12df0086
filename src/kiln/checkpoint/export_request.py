"""What `kiln export` is asked to do: one field per flag (kiln.config.options), unchecked;
kiln.checkpoint.export_run exports it (the export target is checked before any work). Imports no
torch: the CLI builds its parser from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kiln.config.options import option


@dataclass(kw_only=True)
class ExportRequest:
    """`kiln export`'s request, one field per flag."""

    run_dir: Path = option(shape="arg", metavar="RUN_DIR", help="the run directory (holds checkpoints/)")
    checkpoint: Path | None = option(
        None, help="a checkpoint directory (or its name under RUN_DIR/checkpoints); default: newest complete")
    out: Path = option(
        required=True,
        help="FILE.safetensors to write, or a new DIR for a Hugging Face model directory (refused if it exists, "
        "if it is, holds or lies inside RUN_DIR or --checkpoint, or inside a run dir a running kiln process "
        "holds)")
    force: bool = option(False, shape="switch",
                         help="replace --out if it holds an earlier kiln export (only once the new export is complete; "
                         "anything else there is refused)")
    json: bool = option(False, shape="switch", help="print the summary as JSON")
