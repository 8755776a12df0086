"""kiln's int4 layout for `--quant int4@triton` and its layer, `Int4TritonLinear`: 4-bit asymmetric
groups along the input dimension packed eight to an int32 word down K ([K/8, N], outputs
contiguous), scales and offsets [K/group, N]; an RMSNorm weight may be folded in when quantizing,
and a SwiGLU's gate and up rows interleaved (kiln.kernels.triton_int4 reads it, and explains why).

Which kernel multiplies a layer's input of M rows (`int4_path`), chosen by measurement on an
H200 (the int4_rows_swapped results README): below INT4_ROWS_FROM rows kiln.kernels.triton_int4's
one-row kernel (programs per row: its cost grows with the rows, but nothing is padded); from there
up to ROWS_UP_TO rows kiln.kernels.triton_rows' kernel, which reads and unpacks each weight tile
once for a block of 16 rows (its cost barely changes from 4 to 16 rows); above that (larger
batches, prefill) `dequant`: the weight written out in the model dtype once per call, then the
dense matmul, whose cost barely grows with the rows (`dequant_linear`: kiln.kernels.triton_int4_dequant's
kernel, in a compiled forward as a Triton op of the graph, PREFILL_DEQUANT).
Off CUDA (and outside Triton's interpreter) the layer dequantizes in torch and calls `linear`."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import kiln.kernels.triton_int4  # noqa: F401  (registers kiln::int4_matvec)
import kiln.kernels.triton_int4_dequant  # the prefill kernel; registers kiln::int4_dequantize_t and int4_linear_dequant
import kiln.kernels.triton_rows  # noqa: F401  (registers kiln::int4_rows)
from kiln.kernels.triton_launch import interpreting
from kiln.llm.quant_torch import _int4_groups

INT4_ROWS_FROM = 4
"""Rows from which the row kernel (one weight read for a block of rows) replaces the one-row kernel."""
ROWS_UP_TO = 32
"""Rows up to which the row kernel runs; more take the dequantized weight and the dense matmul."""


PREFILL_DEQUANT: Literal["graph", "torch", "kernel"] = "graph"
"""How a compiled forward dequantizes a weight for more than ROWS_UP_TO rows: `graph`, kiln's
dequant kernel as a Triton op of the graph (launched from inductor's wrapper), then the matmul;
`torch`, torch ops that inductor fuses into a dequant kernel of its own; `kernel`, the whole
product as an opaque op, whose Python launch per layer left a compiled prefill waiting on the
host. Eager forwards always call the kernel, with no dispatcher between."""


def int4_path(rows: int) -> str:
    """`matvec`, `rows` or `dequant`: the kernel an input of `rows` rows goes through (module docstring)."""
    if rows > ROWS_UP_TO:
        return "dequant"
    return "rows" if rows >= INT4_ROWS_FROM else "matvec"


def pack_words(q: Tensor) -> Tensor:
    """q [N, K] in [0, 15] -> int32 words [K/8, N], input 8r+j of output n in bits 4j..4j+3 of [r, n]."""
    out_f, in_f = q.shape
    shifts = torch.arange(0, 32, 4, device=q.device, dtype=torch.int64)
    words = (q.to(torch.int64).view(out_f, in_f // 8, 8) << shifts).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words)  # the same 32 bits as a signed int
    return words.to(torch.int32).t().contiguous()


def dequantize_t(packed: Tensor, scale: Tensor, offset: Tensor, group_size: int, dtype: torch.dtype) -> Tensor:
    """W^T [K, N] in `dtype` from the layout (packed [K/8, N], scale and offset [K/group, N]) in torch
    ops: q * scale + offset in fp32, rounded once, as kiln's int4 kernels compute it."""
    kw, n = packed.shape
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int32)
    q = (packed[:, None, :] >> shifts[None, :, None]) & 15  # [K/8, 8, N]: input 8r + j of output n
    w = q.view(-1, group_size, n).float() * scale.float()[:, None, :] + offset.float()[:, None, :]
    return w.to(dtype).view(8 * kw, n)


def dequant_linear(x: Tensor, packed: Tensor, scale: Tensor, offset: Tensor, group_size: int) -> Tensor:
    """x [M, K] times the int4 weight, dequantized first (the `dequant` path; PREFILL_DEQUANT says how)."""
    if not torch.compiler.is_compiling():
        return kiln.kernels.triton_int4_dequant.linear_dequant(x, packed, scale, offset, group_size)
    if PREFILL_DEQUANT == "graph":
        return x @ torch.ops.kiln.int4_dequantize_t(packed, scale, offset, group_size, x.dtype)
    if PREFILL_DEQUANT == "torch":
        return x @ dequantize_t(packed, scale, offset, group_size, x.dtype)
    return torch.ops.kiln.int4_linear_dequant(x, packed, scale, offset, group_size)


def unpack_words(words: Tensor) -> Tensor:
    """`pack_words` undone: [N, K] int32 values in [0, 15]."""
    shifts = torch.arange(0, 32, 4, device=words.device, dtype=torch.int32)
    q = (words.t()[..., None] >> shifts) & 15  # [N, K/8, 8]
    return q.reshape(words.shape[1], -1)


def interleave_halves(t: Tensor) -> Tensor:
    """Rows [gate; up] -> gate 0, up 0, gate 1, up 1, ... (dim 0)."""
    gate, up = t.chunk(2, dim=0)
    return torch.stack([gate, up], dim=1).reshape(t.shape)


def split_halves(t: Tensor, dim: int = 0) -> Tensor:
    """`interleave_halves` undone along `dim`."""
    t = t.movedim(dim, 0)
    return t.view(t.shape[0] // 2, 2, *t.shape[1:]).transpose(0, 1).reshape(t.shape).movedim(0, dim)


class Int4TritonLinear(nn.Module):
    """kiln's int4 layout (module docstring); its product goes through `int4_path`'s kernel.

    `folded_norm`: the weight stands for W diag(norm_w) (an RMSNorm's weight folded in: the
    model's norm must then apply no weight of its own). `interleaved`: gate and up rows
    interleaved, so the kernel can write the SwiGLU (`swiglu=True`); the layer's own forward
    returns the outputs in the original order either way."""

    def __init__(self, packed: Tensor, scale: Tensor, offset: Tensor, bias: Tensor | None, *, group_size: int,
                 interleaved: bool = False, folded_norm: bool = False):
        super().__init__()
        self.in_features, self.out_features = 8 * packed.shape[0], packed.shape[1]
        self.group_size, self.interleaved, self.folded_norm = group_size, interleaved, folded_norm
        self.register_buffer("weight", packed)  # int32 [in/8, out]
        self.register_buffer("scale", scale)  # [in/group, out]: w = q * scale + offset
        self.register_buffer("offset", offset)
        self.bias = bias  # in the stored (interleaved) order

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, group_size: int, *, norm_weight: Tensor | None = None,
                    interleave: bool = False) -> Int4TritonLinear:
        """Quantizes `linear`'s weight (times `norm_weight` per input when given, folding an RMSNorm
        in); `interleave`: the rows are [gate; up] of a SwiGLU, stored interleaved."""
        w = linear.weight.detach()
        dtype = w.dtype
        w = w.float() if norm_weight is None else w.float() * norm_weight.detach().float()[None, :]
        bias = linear.bias
        if interleave:
            w = interleave_halves(w)
            bias = None if bias is None else nn.Parameter(interleave_halves(bias.detach()), requires_grad=False)
        q, scale, zero = _int4_groups(w, group_size)
        offset = zero - 8 * scale  # (q - 8) * scale + zero == q * scale + offset
        return cls(pack_words(q), scale.t().contiguous().to(dtype), offset.t().contiguous().to(dtype), bias,
                   group_size=group_size, interleaved=interleave, folded_norm=norm_weight is not None)

    def dequantize(self, dtype: torch.dtype | None = None, *, stored_order: bool = False) -> Tensor:
        """The weight [out, in] the layer computes with (the folded norm included), in `dtype`:
        q * scale + offset in fp32, rounded once, as kiln's int4 kernels compute it (in the model
        dtype, the product's rounding before the add would differ from theirs in the last bit)."""
        w = dequantize_t(self.weight, self.scale, self.offset, self.group_size, dtype or self.scale.dtype).t()
        return w if stored_order or not self.interleaved else split_halves(w)

    def _bias(self) -> Tensor | None:
        return self.bias if self.bias is None or not self.interleaved else split_halves(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.numel() // self.in_features
        if not (x.is_cuda or interpreting()):
            return F.linear(x, self.dequantize(x.dtype), self._bias())
        flat, path = x.reshape(rows, self.in_features), int4_path(rows)
        if path == "dequant":
            y = dequant_linear(flat, self.weight, self.scale, self.offset, self.group_size)
            y = y if self.bias is None else y + self.bias
        else:
            op = torch.ops.kiln.int4_rows if path == "rows" else torch.ops.kiln.int4_matvec
            y = op(flat, self.weight, self.scale, self.offset, self.group_size, self.bias)
        if self.interleaved:
            y = split_halves(y, dim=1)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        extra = (", gate/up interleaved" if self.interleaved else "") + (", norm folded" if self.folded_norm else "")
        return (f"in_features={self.in_features}, out_features={self.out_features}, int4 triton "
                f"group_size={self.group_size}{extra}")
