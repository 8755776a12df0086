"""A decode step's matrix-vector products (`--decode-matvec`): `inductor` (torch.compile's own
fused reductions) or `triton` (kiln.kernels.triton_matvec), where each can run, and the fused calls.

With `triton` a decode step's layer is four kernel calls around the attention: RMSNorm + wqkv,
wo + the residual add, RMSNorm + w_gate_up, SwiGLU + w_down + the residual add (and the final
norm + lm_head), each one launch of kiln's kernel (`fused_linear`, `fused_mlp`), where inductor
reads the weights more slowly and launches the norms and residual adds between projections as
kernels of their own. With int4@triton weights (kiln.kernels.triton_int4) the norms' weights are
folded into the projections and the SwiGLU is the gate/up kernel's epilogue. Projections the
kernel does not read (torchao's int4 and int8 layouts, bitsandbytes) keep their own matmul with
the norm, SwiGLU and residual add computed around it, which is what `inductor` does for every
projection. At several rows (batch > 1, from `ROWS_KERNEL_FROM`) dense projections take
kiln.kernels.triton_skinny's kernel (the same fused parts, each weight tile read once for all rows)
for the shapes where it was measured faster than the model's own matmul, else that matmul
with the same work around it (a norm whose input kiln's kernel wrote as kiln.kernels.triton_rmsnorm's
kernel, NORM_KERNEL); int4@triton ones take kiln.kernels.triton_rows' kernel (from
kiln.llm.int4_layout's INT4_ROWS_FROM).
kiln.llm.kernels.use_decode_kernels swaps these calls into a model's decode steps.

`auto`, the default, is `triton` where it runs (CUDA, fp16/bf16), else `inductor`; the
measurements are in the decode_matvec results README.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kiln.errors import ConfigError
from kiln.kernels.triton_launch import interpreting

CHOICES = ("auto", "inductor", "triton")
"""`auto` (the default): `triton` where it runs (CUDA, fp16/bf16), else `inductor`."""


def triton_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why `triton` cannot run here, or None when it can."""
    if device.type != "cuda":
        return f"needs a CUDA device (the model is on {device})"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"needs fp16 or bf16 (the model is {str(dtype).replace('torch.', '')})"
    try:
        import kiln.kernels.triton_rows  # noqa: F401  (registers the kernels' ops)
        import kiln.kernels.triton_skinny  # noqa: F401
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


ROWS_KERNEL_FROM = 2
"""Rows (batch x tokens) from which a decode step's dense projections leave the one-row kernel for
kiln.kernels.triton_skinny's row kernel where its table holds the shape, else the model's own
matmul (cuBLAS) (int4 weights: kiln.llm.int4_layout.INT4_ROWS_FROM)."""


NORM_KERNEL = True
"""Where the model's own matmul reads a norm's output and kiln's kernel wrote that norm's input (the
residual stream, at batch > 1: `after_kernel`), the norm runs as kiln.kernels.triton_rmsnorm's
kernel, scheduled while the kernel before it ends, instead of inductor's, launched after it
(measured in the norm_kernel results README); False: inductor's everywhere, for comparisons."""


def _norm(norm: nn.Module, x: Tensor, after_kernel: bool) -> Tensor:
    """`norm(x)` (kiln's RMSNorm), through kiln's norm kernel where `after_kernel` and NORM_KERNEL say so."""
    if (after_kernel and NORM_KERNEL and (x.is_cuda or interpreting()) and not getattr(norm, "folded", False)
            and norm.weight.dtype == x.dtype):
        import kiln.kernels.triton_rmsnorm  # noqa: F401  (Triton is optional; registers kiln::rmsnorm_rows)

        return torch.ops.kiln.rmsnorm_rows(x.reshape(-1, x.shape[-1]), norm.weight, norm.eps).view_as(x)
    return norm(x)


def kernel_writes(layer: nn.Module, x: Tensor) -> bool:
    """Whether kiln's kernel computes `layer`'s output for an input of x's rows, dtype and device
    (the input's width aside): so the kernel after it may be scheduled before it ends."""
    return _kernel_reads(layer, x) is not None


def _kernel_reads(layer: nn.Module, x: Tensor) -> str | None:
    """Which kiln op reads `layer`'s weight for input x, or None (the model's own matmul: a layout
    kiln's kernels do not read, dense weights at several rows, or more rows than they take)."""
    from kiln.kernels.triton_rows import MAX_ROWS
    from kiln.kernels.triton_skinny import device_table, takes
    from kiln.llm.int4_layout import Int4TritonLinear, int4_path  # Triton is optional

    rows = x.numel() // x.shape[-1]
    if rows > MAX_ROWS or not (x.is_cuda or interpreting()):
        return None
    if type(layer) is nn.Linear and type(layer.weight) in (Tensor, nn.Parameter) and layer.weight.dtype == x.dtype:
        if rows < ROWS_KERNEL_FROM:  # a plain weight (torchao's subclasses keep nn.Linear)
            return "matvec"
        return "skinny" if takes(rows, *layer.weight.shape, device_table(x.device)) else None
    if isinstance(layer, Int4TritonLinear):
        return "int4" if int4_path(rows) != "dequant" else None  # many rows: the layer's dequantized matmul
    return None


def fused_linear(layer: nn.Module, x: Tensor, *, norm: nn.Module | None = None, silu_mul: bool = False,
                 residual: Tensor | None = None, after_kernel: bool = False) -> Tensor:
    """residual + layer(f(x)) with f = `norm` (kiln's RMSNorm) or SwiGLU (`silu_mul`: the two halves
    of x's last dim), in one launch of kiln's kernel where it reads the layer's weight. Where it does
    not, `after_kernel` (x was written by kiln's kernel) runs the norm as kiln's norm kernel."""
    reads = _kernel_reads(layer, x)
    if reads is None:
        if norm is not None:
            x = _norm(norm, x, after_kernel)
        if silu_mul:
            gate, up = x.chunk(2, dim=-1)
            x = F.silu(gate) * up
        y = layer(x)
        return y if residual is None else residual + y
    out = layer.out_features
    rows = x.reshape(-1, x.shape[-1])
    res = residual.reshape(-1, out) if residual is not None else None
    if reads in ("matvec", "skinny"):
        norm_weight, eps = (norm.weight, norm.eps) if norm is not None else (None, 0.0)
        op = torch.ops.kiln.matvec if reads == "matvec" else torch.ops.kiln.skinny
        y = op(rows, layer.weight, layer.bias, norm_weight, eps, silu_mul, res)
    else:
        y = _int4(layer, rows, norm, "silu_mul" if silu_mul else "none", False, res)
        if layer.interleaved:
            y = _split_halves(y)
    return y.view(*x.shape[:-1], out)


def fused_mlp(ffn: nn.Module, x: Tensor, norm: nn.Module, residual: Tensor, *, after_kernel: bool = False) -> Tensor:
    """residual + w_down(silu(gate) * up) of `norm(x)`, gate and up from `ffn.w_gate_up`: two kernel
    launches; with int4@triton's interleaved gate/up rows the first writes the SwiGLU itself.
    `after_kernel` as `fused_linear`'s."""
    gate_up, down = ffn.w_gate_up, ffn.w_down
    if _kernel_reads(gate_up, x) == "int4" and gate_up.interleaved:
        rows = x.reshape(-1, x.shape[-1])
        act = _int4(gate_up, rows, norm, "none", True, None).view(*x.shape[:-1], gate_up.out_features // 2)
        return fused_linear(down, act, residual=residual)
    return fused_linear(down, fused_linear(gate_up, x, norm=norm, after_kernel=after_kernel), silu_mul=True,
                        residual=residual)


def _int4(layer: nn.Module, rows: Tensor, norm: nn.Module | None, prologue: str, swiglu: bool,
          residual: Tensor | None) -> Tensor:
    """kiln::int4_matvec (one row) or kiln::int4_rows (several, as kiln.llm.int4_layout.int4_path
    picks) on an `Int4TritonLinear`; a norm whose weight the layer folded in is one
    scalar per row (the `rms` prologue)."""
    if norm is not None:
        if layer.folded_norm != getattr(norm, "folded", False):
            raise ValueError("int4@triton: a layer with a folded norm weight needs its norm folded too (and back)")
        prologue = "rms" if layer.folded_norm else "rmsnorm"
    norm_weight = norm.weight if norm is not None and not layer.folded_norm else None
    from kiln.llm.int4_layout import int4_path  # Triton is optional

    eps = norm.eps if norm is not None else 0.0
    op = torch.ops.kiln.int4_rows if int4_path(rows.shape[0]) == "rows" else torch.ops.kiln.int4_matvec
    return op(rows, layer.weight, layer.scale, layer.offset, layer.group_size, layer.bias,
                                      norm_weight, eps, prologue, swiglu, residual)


def _split_halves(y: Tensor) -> Tensor:
    from kiln.llm.int4_layout import split_halves  # Triton is optional

    return split_halves(y, dim=1)
