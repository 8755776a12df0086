"""Weights for a model sharded while it was still on the meta device: each rank allocates only its
own shards and fills them from the model's full initial tensors, one parameter at a time.

Built on the device first, an 8B model would take its whole fp32 self (32 GB) on every rank before
FSDP2 sharded it. Here the peak is one rank's shards plus the largest single parameter, and the
values are the ones a one-process build holds: each full tensor is drawn (or read) exactly as that
build draws it, and every rank keeps its slice, so the initial weights do not depend on the world
size.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

# Wrappers that insert themselves into parameter names (activation checkpointing's, compile's).
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def plain_name(name: str) -> str:
    """A parameter's name as the unwrapped model has it."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def local_part(full: Tensor, param: Tensor) -> Tensor:
    """This rank's part of `full` for `param` (a DTensor: its placements' slice; else all of it)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(param, DTensor):
        return full
    # src_data_rank=None: every rank holds the same full tensor, so each slices its own part and no
    # collective runs.
    return distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()


def materialise(model: nn.Module, device: torch.device, values: Iterable[tuple[str, Tensor]]) -> int:
    """Allocate `model`'s (sharded, meta) parameters and buffers on `device` and fill each rank's
    part from `values`: (name, full tensor) per parameter, named as the unwrapped model names them.
    Buffers are recomputed by their modules (kiln's rotary frequencies on `to_empty`). Returns how
    many parameters were filled; a parameter left without a value is an error (uninitialised memory
    would train)."""
    model.to_empty(device=device)
    params = {plain_name(name): p for name, p in model.named_parameters()}
    filled = 0
    with torch.no_grad():
        for name, full in values:
            param = params.pop(name, None)
            if param is None:
                raise RuntimeError(f"initial value for {name!r}, which the sharded model does not have")
            local = param.to_local() if hasattr(param, "to_local") else param
            local.copy_(local_part(full.to(device=device, dtype=param.dtype), param))
            filled += 1
    if params:
        raise RuntimeError(f"no initial value for {len(params)} parameters, e.g. {sorted(params)[:3]}")
    return filled
