"""The Triton kernels behind `training.swiglu_kernel=fused` (kiln.train.swiglu).

Both read the gate/up matmul's output `gu` [rows, 2I] (gate in the first I columns, up in the
last I) a block of columns of one row at a time, gate and up of the same columns together:

- forward: h = silu(gate) * up, 6 bytes per h element (bf16);
- backward: d_gate and d_up from gate, up and dh, written into one [rows, 2I] gradient (the layout
  the gate/up matmul's backward reads): 10 bytes per h element, every byte once.

The second is the one inductor cannot match: it builds the [rows, 2I] gradient as a `cat`, one
output element at a time, so each half re-reads gate and dh for its own element (14 bytes per h
element; the llm_train results README has its time on the Llama-3.2-1B shape).

Rounding follows eager PyTorch on the two-op composition `F.silu(gate) * up` (and autograd's
silu_backward and mul backward): fp32 inside each op, the op's result rounded to the input dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

# The fastest of the blocks and warps benchmarks/train_kernels_probe.py tried (the llm_train
# results README).
BLOCK = 4096
NUM_WARPS = 8


@triton.jit
def _swiglu_fwd(gu_ptr, h_ptr, inner, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inner
    src = gu_ptr + row * 2 * inner + cols
    g = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(src + inner, mask=mask, other=0.0)
    silu = (g * tl.sigmoid(g)).to(u.dtype)
    h = silu.to(tl.float32) * u.to(tl.float32)
    tl.store(h_ptr + row * inner + cols, h.to(u.dtype), mask=mask)


@triton.jit
def _swiglu_bwd(gu_ptr, dh_ptr, dgu_ptr, inner, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inner
    src = gu_ptr + row * 2 * inner + cols
    g = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(src + inner, mask=mask, other=0.0)
    dh = tl.load(dh_ptr + row * inner + cols, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)
    silu = (g * sig).to(u.dtype).to(tl.float32)
    d_up = dh * silu
    d_silu = (dh * u.to(tl.float32)).to(u.dtype).to(tl.float32)
    d_gate = d_silu * sig * (1.0 + g * (1.0 - sig))
    dst = dgu_ptr + row * 2 * inner + cols
    tl.store(dst, d_gate.to(u.dtype), mask=mask)
    tl.store(dst + inner, d_up.to(u.dtype), mask=mask)


def swiglu_forward(gu: Tensor) -> Tensor:
    """h [..., I] of a contiguous gu [..., 2I]."""
    inner = gu.shape[-1] // 2
    rows = gu.numel() // max(gu.shape[-1], 1)
    h = gu.new_empty((*gu.shape[:-1], inner))
    if h.numel():
        block = min(BLOCK, triton.next_power_of_2(inner))
        _swiglu_fwd[(rows, triton.cdiv(inner, block))](gu, h, inner, BLOCK=block, num_warps=NUM_WARPS)
    return h


def swiglu_backward(gu: Tensor, dh: Tensor) -> Tensor:
    """d gu [..., 2I] of contiguous gu [..., 2I] and dh [..., I]."""
    inner = gu.shape[-1] // 2
    rows = gu.numel() // max(gu.shape[-1], 1)
    dgu = torch.empty_like(gu)
    if dgu.numel():
        block = min(BLOCK, triton.next_power_of_2(inner))
        _swiglu_bwd[(rows, triton.cdiv(inner, block))](gu, dh, dgu, inner, BLOCK=block, num_warps=NUM_WARPS)
    return dgu
