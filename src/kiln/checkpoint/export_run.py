"""`kiln export`'s steps: where the export goes (refused inside a dir a live kiln process holds),
then the export itself, one safetensors file or a Hugging Face model directory by --out's name."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kiln.checkpoint.export import export_safetensors
from kiln.checkpoint.export_request import ExportRequest
from kiln.checkpoint.hf_export import export_hf_dir
from kiln.outputs import refuse_held_by_another


def export_out(request: ExportRequest) -> Path:
    """--out as an absolute path (`--out .` names the current directory, not ""); a live run's dir is
    its own: exporting from it is fine, writing into it is not."""
    refuse_held_by_another(request.out, "--out", "write the export elsewhere, or once that run has ended")
    return Path(os.path.abspath(request.out))


def respect_umask(out: Path) -> None:
    """Give the exported files the mode any new file gets (0666 less the umask): safetensors
    writes 0600, which hides an export from the group a run dir is shared with."""
    umask = os.umask(0)
    os.umask(umask)
    files = [p for p in out.rglob("*") if p.is_file()] if out.is_dir() else [out]
    for path in files:
        os.chmod(path, 0o666 & ~umask)


def export_checkpoint(request: ExportRequest, out: Path) -> dict[str, Any]:
    """Export into `out` (from `export_out`); returns the summary. Both exports check `out` before
    any work (kiln.checkpoint.export_target): nothing already there is lost."""
    if out.suffix == ".safetensors":
        summary = export_safetensors(request.run_dir, out, checkpoint=request.checkpoint, replace=request.force)
    else:
        summary = export_hf_dir(request.run_dir, out, checkpoint=request.checkpoint, replace=request.force)
    respect_umask(out)
    return summary
