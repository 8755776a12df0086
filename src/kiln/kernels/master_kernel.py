"""The fused update behind `precision.policy=bf16-master` (kiln.train.master_adamw): one Triton
kernel per parameter reads its bf16 gradient, scales it by the clipping coefficient, runs AdamW on
the fp32 master weight and moments, and writes the master back together with its bf16 copy, the
parameter the model computes with.

Per element it moves 28 bytes (gradient 2; master, exp_avg, exp_avg_sq read and written 24; bf16
parameter 2), what torch's fused AdamW moves over fp32 weights and gradients. What it saves is
around it: under `bf16-mixed` autocast casts every fp32 weight to bf16 in the forward (6 bytes),
the backward converts each bf16 weight gradient to fp32 (6 bytes), and clipping reads the fp32
gradients for the norm and again to scale them (12 bytes); here the norm reads bf16 gradients
(2 bytes) and the scaling happens in this kernel's registers.

The arithmetic is torch's fused AdamW's (aten FusedAdamKernel): decoupled weight decay, the moments,
then `master -= lr / bc1 * exp_avg / (sqrt(exp_avg_sq) / sqrt(bc2) + eps)`, all in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 2048


@triton.jit
def _master_adamw(param_ptr, grad_ptr, master_ptr, exp_avg_ptr, exp_avg_sq_ptr, coef_ptr, n,
                  decay, beta1, beta2, step_size, bc2_sqrt, eps,
                  HAS_COEF: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_COEF:
        g = g * tl.load(coef_ptr)
    m = tl.load(master_ptr + offs, mask=mask, other=0.0)
    a = tl.load(exp_avg_ptr + offs, mask=mask, other=0.0)
    s = tl.load(exp_avg_sq_ptr + offs, mask=mask, other=0.0)
    m = m * decay
    a = beta1 * a + (1.0 - beta1) * g
    s = beta2 * s + (1.0 - beta2) * g * g
    m = m - step_size * a / (tl.sqrt(s) / bc2_sqrt + eps)
    tl.store(master_ptr + offs, m, mask=mask)
    tl.store(exp_avg_ptr + offs, a, mask=mask)
    tl.store(exp_avg_sq_ptr + offs, s, mask=mask)
    tl.store(param_ptr + offs, m.to(param_ptr.dtype.element_ty), mask=mask)


def master_adamw_(param: Tensor, grad: Tensor, master: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
                  coef: Tensor | None, *, decay: float, beta1: float, beta2: float, step_size: float,
                  bc2_sqrt: float, eps: float) -> None:
    """Update one parameter in place (all tensors contiguous, on one device; `coef` a 1-element
    fp32 tensor or None). `decay` = 1 - lr * weight_decay, `step_size` = lr / bias_correction1."""
    n = param.numel()
    if n == 0:
        return
    grid = (triton.cdiv(n, BLOCK),)
    _master_adamw[grid](param, grad, master, exp_avg, exp_avg_sq, coef if coef is not None else master, n,
                        decay, beta1, beta2, step_size, bc2_sqrt, eps,
                        HAS_COEF=coef is not None, BLOCK=BLOCK, num_warps=8)


def supported(device: torch.device) -> bool:
    """The kernel runs on CUDA devices (and on CPU tensors under Triton's interpreter, in tests)."""
    return device.type == "cuda"
