"""Consolidate a checkpoint's model weights into one safetensors file, for inference.

Needs neither the model code nor a process group: the tensors' keys, global shapes and dtypes
come from the DCP metadata, so empty tensors of those shapes are allocated and DCP fills them in
this one process, stitching FSDP shards together (the approach of
torch.distributed.checkpoint.format_utils.dcp_to_torch_save, minus its pickled output and its
`torch.load(weights_only=False)` of non-tensor values: only tensors are read, through the safe
reader in kiln.checkpoint.dcp_io).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from kiln.checkpoint.dcp_io import APP_KEY, CheckpointReadError, dcp_load, read_metadata
from kiln.checkpoint.export_target import check_export_target
from kiln.checkpoint.layout import checkpoint_problem, checkpoint_step, latest_complete, read_marker
from kiln.errors import ConfigError
from kiln.safe_io import check_target, write_json

MODEL_PREFIX = f"{APP_KEY}.model."
log = logging.getLogger("kiln.checkpoint")


def find_checkpoint(run_dir: Path, checkpoint: Path | None = None) -> Path:
    """The checkpoint to export: `checkpoint` (as given, or relative to the run's checkpoints/), else
    the newest complete one of `run_dir`. ConfigError when there is none."""
    run_dir = Path(run_dir)
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.exists() and (run_dir / "checkpoints" / path).exists():
            path = run_dir / "checkpoints" / path
        if not path.exists():
            raise ConfigError("--checkpoint", f"{path}: does not exist")
        problem = checkpoint_problem(path)
        if problem is not None:
            raise ConfigError("--checkpoint", f"{path}: not a complete kiln checkpoint: {problem}")
        return path
    if not run_dir.exists():
        raise ConfigError("RUN_DIR", f"{run_dir}: does not exist (a run directory that kiln train wrote)")
    if not run_dir.is_dir():
        raise ConfigError("RUN_DIR", f"{run_dir}: not a directory")
    found = latest_complete(run_dir / "checkpoints")
    if found is None:
        raise ConfigError("RUN_DIR", f"{run_dir}: no complete checkpoint under {run_dir / 'checkpoints'}")
    return found


def load_model_weights(path: Path) -> dict[str, torch.Tensor]:
    """`{fqn: full tensor}` of the model in checkpoint `path`, on CPU."""
    metadata = read_metadata(path)
    wanted: dict[str, torch.Tensor] = {}
    for key, md in metadata.state_dict_metadata.items():
        # Non-tensor model entries (a module's `_extra_state`) have no place in safetensors.
        if key.startswith(MODEL_PREFIX) and hasattr(md, "size") and hasattr(md, "properties"):
            wanted[key] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    if not wanted:
        raise ConfigError("--checkpoint", f"{path}: holds no model tensors (not a kiln training checkpoint?)")
    # A flat dict with DCP's own dotted keys flattens to itself, so DCP matches them 1:1.
    dcp_load(wanted, path, no_dist=True)
    return {key[len(MODEL_PREFIX):]: tensor for key, tensor in wanted.items()}


def readable_weights(run_dir: Path, checkpoint: Path | None = None) -> tuple[Path, dict[str, torch.Tensor]]:
    """(checkpoint, its model weights): `checkpoint` as given, else the newest complete checkpoint of
    `run_dir` whose data can be read; one that cannot is skipped with a warning naming it and why."""
    path = find_checkpoint(run_dir, checkpoint)
    while True:
        try:
            return path, load_model_weights(path)
        except CheckpointReadError as exc:
            older = None if checkpoint is not None else latest_complete(
                Path(run_dir) / "checkpoints", before=checkpoint_step(path))
            if older is None:
                raise
            log.warning("skipping checkpoint %s: %s; exporting the older %s", path, exc, older)
            path = older


def export_safetensors(run_dir: Path, out: Path, *, checkpoint: Path | None = None,
                       replace: bool = False) -> dict[str, Any]:
    """Write the model of the newest readable complete checkpoint (or `checkpoint`) to `out`; returns
    a summary. An existing `out` is refused, or with `replace` replaced when it is an earlier kiln
    export (kiln.checkpoint.export_target)."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise ConfigError("kiln export", "needs safetensors: pip install 'kiln[llm]' (or safetensors)") from None
    out = Path(os.path.abspath(out))
    if out.suffix != ".safetensors":
        raise ConfigError("--out", f"{out}: must end in .safetensors")
    if out.exists() and out.is_dir():
        raise ConfigError("--out", f"{out}: is a directory")
    check_export_target(run_dir, out, checkpoint=checkpoint, force=replace)
    check_target(out.with_name(out.stem + ".kiln_export.json"))
    path, tensors = readable_weights(run_dir, checkpoint)
    # safetensors refuses tensors sharing storage and wants contiguous ones; DCP fills separate
    # buffers, but views of one buffer could still come through, so make each its own.
    seen: set[int] = set()
    for key, tensor in tensors.items():
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen or not tensor.is_contiguous():
            tensors[key] = tensor.contiguous().clone()
        seen.add(tensors[key].untyped_storage().data_ptr())
    marker = read_marker(path) or {}
    header = {"format": "pt", "kiln_checkpoint": str(path), "kiln_step": str(marker.get("step", "")),
              "torch": torch.__version__}
    fd, part = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)  # O_EXCL: ours
    os.close(fd)
    replaced = f"the earlier export at {out} was replaced" if out.exists() else None
    try:
        save_file(tensors, part, metadata=header)
        os.replace(part, out)  # a reader never sees half a file
    except BaseException:
        Path(part).unlink(missing_ok=True)  # a full disk must not keep half a file (and its space)
        raise
    summary = {"checkpoint": str(path), "step": marker.get("step"), "out": str(out), "tensors": len(tensors),
               "parameters": sum(t.numel() for t in tensors.values()), "bytes": out.stat().st_size,
               "replaced": replaced}
    write_json(out.with_name(out.stem + ".kiln_export.json"), summary)
    return summary
