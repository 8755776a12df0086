"""A decode step's matrix-vector products (`--decode-matvec`): `inductor` (torch.compile's own
fused reductions) or `triton` (kiln.llm.triton_matvec), and where each can run.

With `triton` a decode step's layer is four kernel calls around the attention: RMSNorm + wqkv,
wo + the residual add, RMSNorm + w_gate_up, SwiGLU + w_down + the residual add (and the final
norm + lm_head), each one launch of kiln's kernel (`fused_linear`). Projections the kernel does
not read (torchao's int4 and int8 layouts, bitsandbytes) keep their own matmul with the norm,
SwiGLU and residual add computed around it, which is what `inductor` does for every projection.

`auto`, the default, is `triton` where it runs (CUDA, fp16/bf16), else `inductor`. On the 3B shape
on an H100 (benchmarks/results/h100/llm/decode_matvec, 2026-11-25), with kiln.llm.triton_decode's
fused attention: `triton` decoded 373.6 tok/s (82 % of the roofline, 151 kernels per step) and
`inductor` 319.7 tok/s (206 kernels) in two processes of one device call; `triton` read 341-376
tok/s in five more calls that day and `inductor` 309-334 in every call before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kiln.config.errors import ConfigError

CHOICES = ("auto", "inductor", "triton")
"""`auto` (the default): `triton` where it runs (CUDA, fp16/bf16), else `inductor`."""


def triton_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why `triton` cannot run here, or None when it can."""
    if device.type != "cuda":
        return f"needs a CUDA device (the model is on {device})"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"needs fp16 or bf16 (the model is {str(dtype).replace('torch.', '')})"
    try:
        import kiln.llm.triton_matvec  # noqa: F401  (registers the kernel's op)
    except ImportError as exc:
        return f"needs Triton, which does not import here ({exc})"
    return None


def check(choice: str, device: torch.device, dtype: torch.dtype, *, key: str = "decode_matvec") -> str:
    """The kernel `choice` runs as here (`auto` resolved); an unknown choice, or `triton` where it
    cannot run, is a ConfigError naming `key`."""
    if choice not in CHOICES:
        raise ConfigError(key, f"unknown decode matrix-vector kernel {choice!r}", CHOICES)
    if choice == "auto":
        return "triton" if triton_unavailable(device, dtype) is None else "inductor"
    if choice == "triton" and (reason := triton_unavailable(device, dtype)) is not None:
        raise ConfigError(key, f"triton {reason}", CHOICES)
    return choice


def _kernel_reads(layer: nn.Module, x: Tensor) -> str | None:
    """Which kiln op reads `layer`'s weight for input x, or None (a layout it does not read)."""
    from kiln.llm.triton_int4 import Int4TritonLinear
    from kiln.llm.triton_matvec import MAX_ROWS, interpreting

    if x.numel() // x.shape[-1] > MAX_ROWS or not (x.is_cuda or interpreting()):
        return None
    if type(layer) is nn.Linear and type(layer.weight) in (Tensor, nn.Parameter) and layer.weight.dtype == x.dtype:
        return "matvec"  # a plain weight (torchao swaps in tensor subclasses that keep nn.Linear)
    if isinstance(layer, Int4TritonLinear):
        return "int4"
    return None


def fused_linear(layer: nn.Module, x: Tensor, *, norm: nn.Module | None = None, silu_mul: bool = False,
                 residual: Tensor | None = None) -> Tensor:
    """residual + layer(f(x)) with f = `norm` (kiln's RMSNorm) or SwiGLU (`silu_mul`: the two halves
    of x's last dim), in one launch of kiln's kernel where it reads the layer's weight."""
    reads = _kernel_reads(layer, x)
    if reads is None:
        if norm is not None:
            x = norm(x)
        if silu_mul:
            gate, up = x.chunk(2, dim=-1)
            x = F.silu(gate) * up
        y = layer(x)
        return y if residual is None else residual + y
    out = layer.out_features
    rows = x.reshape(-1, x.shape[-1])
    res = residual.reshape(-1, out) if residual is not None else None
    norm_weight, eps = (norm.weight, norm.eps) if norm is not None else (None, 0.0)
    if reads == "matvec":
        y = torch.ops.kiln.matvec(rows, layer.weight, layer.bias, norm_weight, eps, silu_mul, res)
    else:
        y = torch.ops.kiln.int4_matvec(rows, layer.weight, layer.scale, layer.offset, layer.group_size, layer.bias,
                                       norm_weight, eps, silu_mul, res)
    return y.view(*x.shape[:-1], out)
