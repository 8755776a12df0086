"""int4 decode matmuls in Triton (`--quant int4@triton`): kiln's int4 layout read by its own kernel.

The layout is `Int4FusedLinear`'s (kiln.llm.quant_torch): uint8 [out, in/2] with the first half
of the input features in the low nibbles and the second half in the high ones, and per group of
`group_size` inputs a scale and an offset (w = q * scale + offset), [out, in/group].

A decode step multiplies one token (or a few rows) by each weight, so the work is reading the
packed bytes once. Program (block of BLOCK_N outputs, row m) walks the input features R groups
at a time: it loads a [BLOCK_N, R * group] tile of bytes, unpacks both nibbles, multiplies by the
two matching slices of x and sums per group, then applies the group's scale and offset as
scale * sum(q * x) + offset * sum(x), so dequantized weights never exist. Launch settings
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
    BK: tl.constexpr = R * GROUP
    HALF_GROUPS: tl.constexpr = HALF // GROUP
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, HALF, BK):
        kk = k0 + tl.arange(0, BK)
        w = tl.load(W + n[:, None] * stride_wn + kk[None, :], mask=n_ok[:, None], other=0)
        x_lo = tl.load(X + m * stride_xm + kk).to(tl.float32)
        x_hi = tl.load(X + m * stride_xm + HALF + kk).to(tl.float32)
        lo = (w & 15).to(tl.float32)
        hi = (w >> 4).to(tl.float32)
        dot_lo = tl.sum(tl.reshape(lo * x_lo[None, :], [BLOCK_N, R, GROUP]), 2)  # [BLOCK_N, R] per group
        dot_hi = tl.sum(tl.reshape(hi * x_hi[None, :], [BLOCK_N, R, GROUP]), 2)
        sum_lo = tl.sum(tl.reshape(x_lo, [R, GROUP]), 1)  # [R]
        sum_hi = tl.sum(tl.reshape(x_hi, [R, GROUP]), 1)
        g = k0 // GROUP + tl.arange(0, R)
        at = n[:, None] * stride_sn + g[None, :]
        s_lo = tl.load(Scale + at, mask=n_ok[:, None], other=0.0).to(tl.float32)
        o_lo = tl.load(Offset + at, mask=n_ok[:, None], other=0.0).to(tl.float32)
        s_hi = tl.load(Scale + at + HALF_GROUPS, mask=n_ok[:, None], other=0.0).to(tl.float32)
        o_hi = tl.load(Offset + at + HALF_GROUPS, mask=n_ok[:, None], other=0.0).to(tl.float32)
        acc += tl.sum(s_lo * dot_lo + o_lo * sum_lo[None, :] + s_hi * dot_hi + o_hi * sum_hi[None, :], 1)
    tl.store(Y + m * stride_ym + n, acc.to(Y.dtype.element_ty), mask=n_ok)


def _configs() -> list[triton.Config]:
    # Few rows with many groups per iteration put a program's whole share of bytes in flight at
    # once (no serial loop); many rows with one group per iteration lean on pipelining instead.
    # The first H100 run (2026-11-24) had only the second kind: 12.4 us per call on average
    # against tinygemm's 9.9.
    settings = ((2, 8, 4, 1), (2, 16, 4, 1), (4, 4, 4, 1), (4, 8, 4, 1), (4, 16, 8, 1), (8, 4, 4, 1),
                (8, 4, 8, 2), (8, 8, 8, 1), (16, 2, 4, 3), (16, 4, 8, 2), (32, 1, 4, 4), (2, 32, 8, 1))
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
