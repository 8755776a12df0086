"""Where `kiln export` may write, decided before any work: never onto, above or inside what it
reads (the run dir, the checkpoint), never through a link, into a folder that takes files; and
`--force` replaces only an earlier kiln export it recognises (a safetensors file, or a Hugging Face
directory of the files kiln writes, whose weights carry kiln's `kiln_checkpoint` metadata), so a
mistyped `--out` can never remove a run, a home directory or the user's files.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from kiln.data.tokenizers_io import TOKENIZER_FILES
from kiln.errors import ConfigError
from kiln.outputs import probe_writable
from kiln.safe_io import LinkRefused, open_read, refuse_links, regular_file_problem

EXPORT_FILES = frozenset(("model.safetensors", "config.json", "generation_config.json", *TOKENIZER_FILES))
"""What an HF directory export holds: kiln writes nothing else there."""
_HEADER_LIMIT = 100 << 20  # safetensors' own cap on its JSON header


def _overlap(out: Path, source: Path) -> str | None:
    if out == source:
        return "is"
    if out in source.parents:
        return "holds"
    if source in out.parents:
        return "lies inside"
    return None


def safetensors_metadata(path: Path) -> dict[str, str] | None:
    """The `__metadata__` of a safetensors file (read from its header only), None when `path` is
    not a regular safetensors file."""
    try:
        with open_read(path, 1 << 62) as f:
            head = f.read(8)
            if len(head) < 8:
                return None
            (size,) = struct.unpack("<Q", head)
            if size > _HEADER_LIMIT:
                return None
            header = json.loads(f.read(size))
    except (OSError, ValueError):
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else None


def earlier_export_problem(out: Path) -> str | None:
    """Why `out` is not an export kiln wrote (and so not for `--force` to replace), or None."""
    if out.is_dir() and not out.is_symlink():
        names = sorted(os.listdir(out))
        foreign = [n for n in names if n not in EXPORT_FILES or regular_file_problem(out / n)]
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" (+{len(foreign) - 5} more)" if len(foreign) > 5 else "")
            return f"it holds what a kiln export never writes ({shown})"
        weights = out / "model.safetensors"
    else:
        weights = out
    if "kiln_checkpoint" not in (safetensors_metadata(weights) or {}):
        return f"{weights.name} is not a safetensors file kiln exported"
    return None


def check_export_target(run_dir: Path, out: Path, *, checkpoint: Path | None, force: bool) -> Path:
    """`out` as an absolute path where this export may write (ConfigError, exit 2, otherwise).
    The run dir (and `checkpoint`) are also looked over for links: read, they would be followed."""
    out = Path(os.path.abspath(out))
    real_out = Path(os.path.realpath(out))
    for flag, source in (("RUN_DIR", run_dir), ("--checkpoint", checkpoint)):
        if source is None or not Path(source).exists():
            continue
        real = Path(os.path.realpath(source))
        how = _overlap(real_out, real)
        if how is not None:
            raise ConfigError("--out", f"{out} {how} {flag} {source}, which the export reads; write it elsewhere")
    if Path(run_dir).is_dir():
        refuse_links(run_dir)
    if checkpoint is not None and Path(checkpoint).is_dir():
        refuse_links(checkpoint)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("--out", f"{out}: cannot create its directory {out.parent} ({exc.strerror or exc})") from None
    probe_writable(out.parent, "--out", out)
    if out.is_symlink():
        raise LinkRefused(out, f"is a symbolic link to {os.readlink(out)}")
    if out.exists():
        kind = "directory" if out.is_dir() else "file"
        if not force:
            raise ConfigError("--out", f"{out} already exists (a {kind}); choose another path, or pass --force "
                              "to replace an earlier kiln export there")
        problem = earlier_export_problem(out)
        if problem is not None:
            raise ConfigError("--out", f"{out} is not an earlier kiln export ({problem}); --force replaces only "
                              "those: choose another path")
    return out
