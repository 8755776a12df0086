"""int4 decode matmuls in Triton (`--quant int4@triton`): kiln's int4 layout read by its own kernel.

The layout is `Int4FusedLinear`'s (kiln.llm.quant_torch): uint8 [out, in/2] with the first half
of the input features in the low nibbles and the second half in the high ones, and per group of
`group_size` inputs a scale and an offset (w = q * scale + offset), [out, in/group].

A decode step multiplies one token (or a few rows) by each weight, so the work is reading the
packed bytes once. Program (block of BLOCK_N outputs, row m) walks the input features a group
at a time (R groups' loads issued together): it loads a [BLOCK_N, group] tile of bytes, unpacks
both nibbles, dequantizes them in registers with the group's scale and offset (one per output
row) and accumulates their products with the two matching slices of x elementwise; one
reduction across lanes at the end gives the outputs. Launch settings
(BLOCK_N, R, warps, stages) are autotuned per matrix shape on the first call (the engine's
warm-up steps, before its CUDA graph is captured).

Why: torch's tinygemm kernel (torchao's int4 layout) pads the token to a 16-row tile and read its
int4 weights at ~1.3 TB/s on an H100 in the 3B decode profile (113 calls of ~10 us per step,
two thirds of the step); inductor's own fusion of this layout (`int4@inductor`) was slower still.
Longer inputs (prefill) dequantize the weight and call `linear`.

Tests run it on CPU through Triton's interpreter (TRITON_INTERPRET=1) with a fixed setting.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from kiln.llm.quant_torch import Int4FusedLinear

MAX_ROWS = 8
"""Rows (batch x tokens) up to which the kernel runs; longer inputs dequantize and call `linear`."""


def _int4_matvec(X, W, Scale, Offset, Y, N, stride_xm, stride_wn, stride_sn, stride_ym,
                 HALF: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, R: tl.constexpr):
    pid = tl.program_id(0)
    m = tl.program_id(1)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    kk = tl.arange(0, GROUP)
    HALF_GROUPS: tl.constexpr = HALF // GROUP
    w_rows = W + n[:, None] * stride_wn + kk[None, :]
    s_rows = n * stride_sn
    x_row = X + m * stride_xm + kk
    # Elementwise products accumulate in a [BLOCK_N, GROUP] tile, reduced across lanes once at the
    # end; each group's scale and offset are one value per row, broadcast along the group.
    acc = tl.zeros([BLOCK_N, GROUP], dtype=tl.float32)
    for g0 in range(0, HALF_GROUPS, R):
        for j in tl.static_range(R):  # R groups' loads issued back to back
            g = g0 + j
            w = tl.load(w_rows + g * GROUP, mask=n_ok[:, None], other=0)
            x_lo = tl.load(x_row + g * GROUP).to(tl.float32)
            x_hi = tl.load(x_row + HALF + g * GROUP).to(tl.float32)
            s_lo = tl.load(Scale + s_rows + g, mask=n_ok, other=0.0).to(tl.float32)
            o_lo = tl.load(Offset + s_rows + g, mask=n_ok, other=0.0).to(tl.float32)
            s_hi = tl.load(Scale + s_rows + HALF_GROUPS + g, mask=n_ok, other=0.0).to(tl.float32)
            o_hi = tl.load(Offset + s_rows + HALF_GROUPS + g, mask=n_ok, other=0.0).to(tl.float32)
            lo = (w & 15).to(tl.float32)
            hi = (w >> 4).to(tl.float32)
            acc += (lo * s_lo[:, None] + o_lo[:, None]) * x_lo[None, :]
            acc += (hi * s_hi[:, None] + o_hi[:, None]) * x_hi[None, :]
    tl.store(Y + m * stride_ym + n, tl.sum(acc, 1).to(Y.dtype.element_ty), mask=n_ok)


def _configs() -> list[triton.Config]:
    # The first H100 runs (2026-11-24) reduced across lanes per group (tl.reshape + sum every
    # iteration): 12 us per call on average against tinygemm's 9.9, whatever the tile.
    settings = ((16, 1, 4, 4), (32, 1, 4, 4), (32, 2, 4, 3), (64, 1, 8, 3), (64, 2, 8, 2), (16, 2, 4, 3),
                (8, 4, 4, 2), (32, 4, 8, 2), (128, 1, 8, 2), (16, 4, 4, 2))
    return [triton.Config({"BLOCK_N": bn, "R": r}, num_warps=w, num_stages=s) for bn, r, w, s in settings]


def _prune(configs, named_args, **kwargs):
    """Keep settings whose R groups divide each half of the input features."""
    args = {**named_args, **kwargs}
    groups = args["HALF"] // args["GROUP"]
    kept = [c for c in configs if groups % c.kwargs["R"] == 0]
    return kept or [triton.Config({"BLOCK_N": 16, "R": 1}, num_warps=4, num_stages=3)]


_KERNELS: dict[bool, object] = {}
INTERPRETED_SETTING = {"BLOCK_N": 16, "R": 1}
"""The one setting under Triton's interpreter (no GPU to tune on)."""


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _kernel():
    interpret = _interpreting()
    if interpret not in _KERNELS:
        jitted = triton.jit(_int4_matvec)
        _KERNELS[interpret] = jitted if interpret else triton.autotune(
            configs=_configs(), key=["N", "HALF", "GROUP"], prune_configs_by={"early_config_prune": _prune})(jitted)
    return _KERNELS[interpret]


@torch.library.custom_op("kiln::int4_matvec", mutates_args=())
def int4_matvec(x: Tensor, packed: Tensor, scale: Tensor, offset: Tensor, group_size: int) -> Tensor:
    """x [M, K] (M <= MAX_ROWS) times the int4 weight (`Int4FusedLinear`'s buffers) -> [M, out] in x's dtype."""
    x = x.contiguous()
    M, K = x.shape
    N = packed.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    args = (x, packed, scale, offset, y, N, x.stride(0), packed.stride(0), scale.stride(0), y.stride(0))
    if _interpreting():
        block = INTERPRETED_SETTING["BLOCK_N"]
        _kernel()[(triton.cdiv(N, block), M)](*args, HALF=K // 2, GROUP=group_size, **INTERPRETED_SETTING)
    else:
        _kernel()[lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), M)](*args, HALF=K // 2, GROUP=group_size)
    return y


@int4_matvec.register_fake
def _(x, packed, scale, offset, group_size):
    return x.new_empty(x.shape[0], packed.shape[0])


class Int4TritonLinear(Int4FusedLinear):
    """`Int4FusedLinear`'s layout; up to MAX_ROWS rows go through kiln's Triton kernel."""

    def forward(self, x: Tensor) -> Tensor:
        rows = x.numel() // self.in_features
        if rows > MAX_ROWS:
            return super().forward(x)
        y = torch.ops.kiln.int4_matvec(x.reshape(rows, self.in_features), self.weight, self.scale, self.offset,
                                       self.group_size).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return super().extra_repr().replace("int4 fused", "int4 triton")
