"""`training.swiglu_kernel`: the SwiGLU of kiln's Llama (kiln.llm.model.FeedForward) through kiln's
own forward and backward kernels, applied to a built model from outside.

`plain` leaves `F.silu(gate) * up` to PyTorch (inductor fuses it when compiled). `fused` swaps each
FeedForward for `FusedSwiGLUFeedForward` (same parameters, state-dict keys and hooks; only
`forward` differs), whose activation is one autograd function over two opaque ops,
`kiln::swiglu` and `kiln::swiglu_backward`. On CUDA they run kiln's Triton kernels
(kiln.kernels.swiglu_kernel): the backward reads gate, up and the incoming gradient once and writes
both halves of the gate/up gradient, where inductor's fused backward reads gate and dh twice.
Elsewhere the ops run the same arithmetic as PyTorch ops, so results match eager PyTorch's.
The kernel applies by capability: to every kiln FeedForward (a family's subclass of it keeps its
own code, kiln.llm.swap), unless the model is a kiln decoder whose family spec does not take
`swiglu`. `auto` is `fused` on CUDA for models that have such a FeedForward, else `plain`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kiln.errors import ConfigError
from kiln.llm.decoder_config import DecoderConfig
from kiln.llm.families import takes_kernel
from kiln.llm.model import FeedForward
from kiln.llm.swap import swap_class

KERNELS = ("plain", "fused")


def _reference_forward(gu: Tensor) -> Tensor:
    gate, up = gu.chunk(2, dim=-1)
    return F.silu(gate) * up


def _reference_backward(gu: Tensor, dh: Tensor) -> Tensor:
    """Eager autograd's gradient of `F.silu(gate) * up`, op by op (mul's backward, silu_backward)."""
    gate, up = gu.chunk(2, dim=-1)
    d_up = dh * F.silu(gate)
    d_gate = torch.ops.aten.silu_backward(dh * up, gate)
    return torch.cat((d_gate, d_up), dim=-1)


def _triton_ready(t: Tensor) -> bool:
    return t.is_cuda and t.dtype in (torch.bfloat16, torch.float16, torch.float32)


@torch.library.custom_op("kiln::swiglu", mutates_args=())
def swiglu_op(gu: Tensor) -> Tensor:
    """silu(gate) * up of gu [..., 2I] = cat(gate, up) -> [..., I]."""
    if _triton_ready(gu):
        from kiln.kernels.swiglu_kernel import swiglu_forward

        return swiglu_forward(gu.contiguous())
    return _reference_forward(gu)


@swiglu_op.register_fake
def _(gu: Tensor) -> Tensor:
    return gu.new_empty((*gu.shape[:-1], gu.shape[-1] // 2))


@torch.library.custom_op("kiln::swiglu_backward", mutates_args=())
def swiglu_backward_op(gu: Tensor, dh: Tensor) -> Tensor:
    """The gradient [..., 2I] of `kiln::swiglu` at gu, given the gradient dh [..., I] of its output."""
    if _triton_ready(gu):
        from kiln.kernels.swiglu_kernel import swiglu_backward

        return swiglu_backward(gu.contiguous(), dh.to(gu.dtype).contiguous())
    return _reference_backward(gu, dh.to(gu.dtype))


@swiglu_backward_op.register_fake
def _(gu: Tensor, dh: Tensor) -> Tensor:
    return torch.empty_like(gu)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gu: Tensor) -> Tensor:
        ctx.save_for_backward(gu)
        return swiglu_op(gu)

    @staticmethod
    def backward(ctx, dh: Tensor) -> Tensor:
        (gu,) = ctx.saved_tensors
        return swiglu_backward_op(gu, dh)


def swiglu(gu: Tensor) -> Tensor:
    """silu(gate) * up of the gate/up matmul's output gu [..., 2I], through kiln's kernels."""
    return _SwiGLU.apply(gu)


class FusedSwiGLUFeedForward(FeedForward):
    """kiln's FeedForward with its activation through `swiglu` (set by `apply_swiglu_kernel`)."""

    _plain_class = FeedForward

    def forward(self, x: Tensor) -> Tensor:
        return self.w_down(swiglu(self.w_gate_up(x)))


def _feed_forwards(model: nn.Module) -> list[FeedForward]:
    """The modules the fused kernel applies to: every kiln FeedForward, none in a kiln decoder whose
    family does not take the SwiGLU kernel (kiln.llm.families)."""
    config = getattr(model, "config", None)
    if isinstance(config, DecoderConfig) and not takes_kernel(config.family, "swiglu"):
        return []
    return [m for m in model.modules() if isinstance(m, FeedForward)]


def resolve_swiglu_kernel(name: str, model: nn.Module, device: torch.device) -> str:
    """What `training.swiglu_kernel=name` means for this model on this device (ConfigError, exit 2,
    for an unknown value, or `fused` on a model without kiln's FeedForward)."""
    if name not in ("auto", *KERNELS):
        raise ConfigError("training.swiglu_kernel", f"unknown value {name!r}", ("auto", *KERNELS))
    has_ffn = bool(_feed_forwards(model))
    if name == "auto":
        return "fused" if has_ffn and device.type == "cuda" else "plain"
    if name == "fused" and not has_ffn:
        raise ConfigError("training.swiglu_kernel", "'fused' applies to kiln's own decoders whose family takes it "
                          "(model.name=llama:...); this model has no kiln FeedForward that does", ("auto", "plain"))
    return name


def apply_swiglu_kernel(model: nn.Module, kernel: str) -> int:
    """Swap every kiln FeedForward in `model` to the `kernel` (`plain` or `fused`) implementation;
    returns how many were swapped. Calling it again with the other value swaps them back."""
    override = FusedSwiGLUFeedForward if kernel == "fused" else None
    return sum(swap_class(module, override) for module in _feed_forwards(model))
