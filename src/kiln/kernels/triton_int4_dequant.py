"""kiln's int4 layout (kiln.llm.int4_layout) dequantized to the model dtype in one Triton kernel: one
way an int4 layer prefills (many rows), by writing its weight out once per call and handing the
product to the dense matmul (cuBLAS), which is compute-bound there. kiln.llm.int4_layout picks
between this and the row kernel's prefill tiles (kiln.kernels.triton_rows), and between the two
ops a compiled graph may hold: the dequantization alone as a Triton op (`kiln::int4_dequantize_t`,
launched from inductor's wrapper) or the whole product as an opaque op (`kiln::int4_linear_dequant`).

A program unpacks one group of input rows for BLOCK_N outputs: words [GROUP/8, BLOCK_N] (word [r,
n] holds inputs 8r..8r+7 of output n) to q [GROUP, BLOCK_N], then w = q * scale + offset in fp32,
rounded once to the model dtype, stored as W^T [K, N] (outputs contiguous, as the words are), so
y = x @ W^T. N is a compile-time constant (a model has a handful of widths), so where BLOCK_N
divides it no load or store is masked: that made the kernel a few percent faster, and launched from
inductor's wrapper as fast as from Python (with N a runtime argument it was slower there).
Tests run it on CPU through Triton's interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op, wrap_triton


@triton.jit
def _dequant(Q, Scale, Offset, W, N: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr):
    g = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    R: tl.constexpr = GROUP // 8
    r = tl.arange(0, R)
    at = (g * R + r)[:, None] * N + n[None, :]
    if EVEN:
        words = tl.load(Q + at)
        scale = tl.load(Scale + g * N + n).to(tl.float32)
        offset = tl.load(Offset + g * N + n).to(tl.float32)
    else:
        words = tl.load(Q + at, mask=(n < N)[None, :], other=0)
        scale = tl.load(Scale + g * N + n, mask=n < N, other=0.0).to(tl.float32)
        offset = tl.load(Offset + g * N + n, mask=n < N, other=0.0).to(tl.float32)
    q = (words[:, None, :] >> (4 * tl.arange(0, 8))[None, :, None]) & 15  # [R, 8, BLOCK_N]: input 8r + j
    q = tl.reshape(q, [GROUP, BLOCK_N]).to(tl.float32)
    w = (q * scale[None, :] + offset[None, :]).to(W.dtype.element_ty)
    k = g * GROUP + tl.arange(0, GROUP)
    if EVEN:
        tl.store(W + k[:, None] * N + n[None, :], w)
    else:
        tl.store(W + k[:, None] * N + n[None, :], w, mask=(n < N)[None, :])


BLOCK_N = 128


def int4_dequantize_t(packed: Tensor, scale: Tensor, offset: Tensor, group_size: int, dtype: torch.dtype,
                      kernel=_dequant) -> Tensor:
    """The int4 weight as W^T [K, N] in `dtype` (packed [K/8, N] int32, scale and offset [K/group, N]);
    `kernel`: `_dequant` itself (eager) or wrapped for tracing (the Triton op)."""
    KW, N = packed.shape
    K = 8 * KW
    w = torch.empty(K, N, dtype=dtype, device=packed.device)
    kernel[(K // group_size, triton.cdiv(N, BLOCK_N))](packed, scale, offset, w, N, GROUP=group_size, BLOCK_N=BLOCK_N,
                                                       EVEN=N % BLOCK_N == 0, num_warps=4)
    return w


@triton_op("kiln::int4_dequantize_t", mutates_args=())
def int4_dequantize_t_op(packed: Tensor, scale: Tensor, offset: Tensor, group_size: int, dtype: torch.dtype) -> Tensor:
    """`int4_dequantize_t` as a Triton op: torch.compile puts the kernel itself in its graph, launched
    from inductor's wrapper (no Python launch per call)."""
    return int4_dequantize_t(packed, scale, offset, group_size, dtype, kernel=wrap_triton(_dequant))


@int4_dequantize_t_op.register_fake
def _(packed, scale, offset, group_size, dtype):  # shapes without tracing the launch (Triton's interpreter runs it)
    return packed.new_empty(8 * packed.shape[0], packed.shape[1], dtype=dtype)


def linear_dequant(x: Tensor, packed: Tensor, scale: Tensor, offset: Tensor, group_size: int) -> Tensor:
    """x [M, K] times the int4 weight: dequantized to x's dtype by the kernel, then x @ W^T."""
    return x @ int4_dequantize_t(packed, scale, offset, group_size, x.dtype)


@torch.library.custom_op("kiln::int4_linear_dequant", mutates_args=())
def int4_linear_dequant(x: Tensor, packed: Tensor, scale: Tensor, offset: Tensor, group_size: int) -> Tensor:
    """`linear_dequant` as an opaque op for torch.compile."""
    return linear_dequant(x, packed, scale, offset, group_size)


@int4_linear_dequant.register_fake
def _(x, packed, scale, offset, group_size):
    return x.new_empty(x.shape[0], packed.shape[1])
