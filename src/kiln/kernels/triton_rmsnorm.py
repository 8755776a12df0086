"""kiln's RMSNorm of a few rows (a decode step at batch > 1) in Triton, launched with programmatic
dependent launch, for the norms whose projection is the model's own matmul (cuBLAS), where the
norm cannot be fused into kiln's kernel (kiln.llm.decode_matvec).

One program per row reads the whole row (its weight before waiting for the previous kernel),
computes 1/rms in fp32 and writes norm_w * (h / rms(h)), rounded as kiln's RMSNorm rounds in
eager (the normalized row to the model dtype, then the product with the weight). Why: compiled,
such a norm is a kernel of inductor's, launched only once the kernel before it has ended; on Hopper
this one is scheduled while that kernel's last programs run (when that kernel is one of kiln's,
which let their dependents launch), so its launch overlaps that kernel's end. Tests run it on CPU
through Triton's interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kiln.kernels.triton_launch import pdl_enabled


@triton.jit
def _rmsnorm_rows(X, W, Y, stride_xm, stride_ym, eps, K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0)
    k = tl.arange(0, BLOCK)
    ok = k < K
    w = tl.load(W + k, mask=ok, other=0.0).to(tl.float32)  # no kernel writes the weight: read before the wait
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    h = tl.load(X + row * stride_xm + k, mask=ok, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(h * h, 0) / K + eps)
    dtype = Y.dtype.element_ty
    normed = (h * rstd).to(dtype).to(tl.float32)
    tl.store(Y + row * stride_ym + k, (w * normed).to(dtype), mask=ok)


def rmsnorm_rows(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """weight * (x / rms(x)) per row of x [M, K] (weight [K] in x's dtype), as kiln's RMSNorm."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    M, K = x.shape
    y = torch.empty_like(x)
    pdl = pdl_enabled(x.device)
    block = triton.next_power_of_2(K)
    _rmsnorm_rows[(M,)](x, weight, y, x.stride(0), y.stride(0), eps, K=K, BLOCK=block, PDL=pdl,
                        num_warps=4 if block <= 4096 else 8, **({"launch_pdl": True} if pdl else {}))
    return y


@torch.library.custom_op("kiln::rmsnorm_rows", mutates_args=())
def rmsnorm_rows_op(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`rmsnorm_rows` as an opaque op for torch.compile (so the compiled step keeps its launch)."""
    return rmsnorm_rows(x, weight, eps)


@rmsnorm_rows_op.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)
