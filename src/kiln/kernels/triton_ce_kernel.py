"""The Triton kernels behind `training.ce_kernel=triton` (kiln.kernels.triton_ce).

- forward, one program per row of logits [rows, V]: the log-sum-exp in one pass over the row, a
  block of columns at a time (the block's maximum, then one exponential per element against the
  running maximum), and the row's loss `lse - logit[target]` (0 for an ignored target);
- backward, a block of columns of one row per program: `(exp(logit - lse) - onehot) * g` in the
  logits' dtype, one read and one write per element.

Why the forward: inductor's fused cross-entropy forward (its online-softmax reduction,
`prepare_softmax_online`) ran well below the copy rate on the Llama-3.2-1B step's logits (the
llm_train results README has the profile).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

# The fastest of the blocks benchmarks/train_kernels_probe.py tried (the llm_train results README).
FWD_BLOCK = 8192
FWD_WARPS = 8
BWD_BLOCK = 8192
BWD_WARPS = 8


@triton.jit
def _ce_fwd(x_ptr, t_ptr, loss_ptr, lse_ptr, vocab: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * vocab
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.full((), 0.0, tl.float32)
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        new_m = tl.maximum(m, tl.max(x, 0))
        safe_m = tl.where(new_m == float("-inf"), 0.0, new_m)  # a row of -inf so far: no NaN from inf - inf
        s = s * tl.exp2((m - safe_m) * 1.4426950408889634) + tl.sum(tl.exp2((x - safe_m) * 1.4426950408889634), 0)
        m = new_m
    lse = m + tl.log(s)
    t = tl.load(t_ptr + row)
    valid = (t >= 0) & (t < vocab)
    picked = tl.load(base + tl.where(valid, t, 0)).to(tl.float32)
    tl.store(lse_ptr + row, lse)
    tl.store(loss_ptr + row, tl.where(valid, lse - picked, 0.0))


@triton.jit
def _ce_bwd(x_ptr, t_ptr, lse_ptr, g_ptr, dx_ptr, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < vocab
    x = tl.load(x_ptr + row * vocab + cols, mask=mask, other=0.0)
    lse = tl.load(lse_ptr + row)
    t = tl.load(t_ptr + row)
    g = tl.where((t >= 0) & (t < vocab), tl.load(g_ptr + row), 0.0)  # an ignored target: no gradient
    p = tl.exp2((x.to(tl.float32) - lse) * 1.4426950408889634)
    d = (p - tl.where(cols == t, 1.0, 0.0)) * g
    tl.store(dx_ptr + row * vocab + cols, d.to(x.dtype), mask=mask)


def ce_forward(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row loss and log-sum-exp (fp32 [rows]) of contiguous logits [rows, V] and targets [rows]."""
    rows, vocab = logits.shape
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        block = min(FWD_BLOCK, triton.next_power_of_2(vocab))
        _ce_fwd[(rows,)](logits, targets, loss, lse, vocab, BLOCK=block, num_warps=FWD_WARPS)
    return loss, lse


def ce_backward(logits: Tensor, targets: Tensor, lse: Tensor, grad_rows: Tensor) -> Tensor:
    """d(sum of grad_rows * loss rows)/d logits in the logits' dtype (zero on rows of ignored targets)."""
    rows, vocab = logits.shape
    dx = torch.empty_like(logits)
    if rows:
        block = min(BWD_BLOCK, triton.next_power_of_2(vocab))
        _ce_bwd[(rows, triton.cdiv(vocab, block))](logits, targets, lse, grad_rows, dx, vocab,
                                                   BLOCK=block, num_warps=BWD_WARPS)
    return dx
