"""Activation checkpointing per repeated block, applied from outside the model.

`full`: a block keeps only its input; backward runs its forward again. `selective` (op-level
selective activation checkpointing, torch.utils.checkpoint's policies): a block keeps the outputs
of its matmuls and of its attention kernel, and recomputes the elementwise ops between them
(norms, rotary embedding, SiLU-gating, residual adds), which are cheap to redo but hold many
activations. Both give the same gradients as no checkpointing (the recomputation repeats the same
ops on the same inputs).

Each block's `forward` is replaced by a checkpointed call of the original one (an instance
attribute, so the state dict, the module tree and `BuiltModel.blocks` stay as they are, and
compile / FSDP2 applied afterwards wrap the checkpointed block, as torchtitan orders them).
"""

from __future__ import annotations

import functools
from typing import get_args

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint

from kiln.config.schema import ActivationCheckpointing

MODES = tuple(m for m in get_args(ActivationCheckpointing) if m != "auto")
"""The modes a block can be checkpointed in (`auto` is resolved to one of them by the memory plan)."""


def _saved_ops() -> frozenset:
    """The ops whose outputs `selective` keeps: matmuls (also float8's scaled matmul) and the fused
    attention kernels, those of this torch build that exist."""
    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "_scaled_mm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu")
    return frozenset(getattr(aten, n).default for n in names if hasattr(aten, n))


def _policy(ctx, op, *args, **kwargs):
    """Called for every op of a checkpointed block, in forward and in recompute: kept to a lookup."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


SAVED_OPS = _saved_ops()


def _selective_context():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_policy)


def _checkpointed(forward, mode: str, *args, **kwargs):
    if mode == "selective":
        return checkpoint(forward, *args, use_reentrant=False, context_fn=_selective_context, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def without_plan(mode: str) -> str:
    """`training.activation_checkpointing` where no device memory plan resolves `auto`: `auto` is none."""
    return "none" if mode == "auto" else mode


def apply_activation_checkpointing(blocks: list[torch.nn.Module], mode: str) -> int:
    """Checkpoint each block's forward (`full` or `selective`); returns the number of blocks wrapped."""
    if mode not in MODES:
        raise ValueError(f"unknown activation checkpointing mode {mode!r}; choose from {MODES}")
    if mode == "none":
        return 0
    for block in blocks:
        block.forward = functools.partial(_checkpointed, block.forward, mode)
    return len(blocks)
