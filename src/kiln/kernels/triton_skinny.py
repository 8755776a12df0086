"""kiln's dense decode projections for 2 to MAX_ROWS rows (a decode step at batch > 1), written in
Triton, with the same fused parts as the one-row kernel (kiln.kernels.triton_matvec): an RMSNorm
or a SwiGLU of the input halves before, a bias and a residual add after.

The RMSNorm's 1/rms is a scalar per row, so it is applied to the product, not to x: the loop
multiplies x times the norm's weight (rounded to the model dtype) and adds up the squares of the x
tiles it reads anyway; each split's sums of squares go beside its partial sums, and the program
that adds the splits scales the rows by 1/rms. A pass over x before the loop (the one-row kernel's
way, which rounds as eager does) delayed every program's first weight read. Results differ from
eager's roundings by bf16 rounding, as a different summation order does.

At a few rows a projection is a read of its weight: the products are a small fraction of the
tensor cores' time. So a program owns a block of BLOCK_N outputs and a split of K, for all the
rows at once (padded to 16, the tensor cores' smallest tile: `block_m`): it reads each weight tile
once and multiplies it on the tensor cores with the weight as the left operand (y^T = W x^T: the
BLOCK_N outputs fill the instruction's wide side, the few rows its narrow one). Splits of K give
the narrow projections enough programs to keep every SM's loads in flight; each split writes its
fp32 partial sums and the last program of a block to arrive adds them in split order
(kiln.kernels.triton_matvec._split_sum), so results do not depend on arrival order.

Launch settings come from a small table measured on an H100 (`SETTINGS`, keyed by the row tile,
N and K; the sweep's command is in the decode_rows results README), not from autotuning: warm-up
tunes nothing and every process picks the same; shapes it does not hold take the rule
`default_setting`. kiln.llm.decode_matvec takes the kernel only for the shapes in `TAKEN`, where
it was measured faster than the model's own matmul; elsewhere that matmul runs. A GPU whose own
sweep found more such shapes adds them with their settings (`GPU_TABLES`, by device name): the
H200 reads faster than the H100 the table was measured on, and at 32 rows its wo and lm_head run
faster through the kernel, where the H100's ran faster through cuBLAS at every setting swept. With programmatic
dependent launch (Hopper) a program waits for the previous kernel before reading anything, then
lets the next kernel be scheduled. Tests run the kernel on CPU through Triton's interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kiln.kernels.int4_groups import _rows_x
from kiln.kernels.triton_launch import arrival_counters, interpreting, pdl_enabled
from kiln.kernels.triton_matvec import _split_sum
from kiln.kernels.triton_rows import _keep_squares, _rows_epilogue, _split_rstd, block_m

MAX_ROWS = 64
"""Rows (batch x tokens) the kernel takes: all of them in one row tile, so each weight tile is read once."""
MAX_SPLIT = 8


def _skinny(X, W, Y, NormW, Bias, Res, Part, Arrived, M, N, eps,
            stride_xm, stride_wn, stride_ym, stride_rm,
            K: tl.constexpr, PROLOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
            PDL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            SPLIT: tl.constexpr, PER_SPLIT: tl.constexpr, EVEN: tl.constexpr):
    pid = tl.program_id(0)  # the block of outputs
    pid_k = tl.program_id(1)  # the split of K
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    kk = tl.arange(0, BLOCK_K)
    k_lo = pid_k * PER_SPLIT
    TILES: tl.constexpr = PER_SPLIT // BLOCK_K
    w_rows = W + n[:, None] * stride_wn
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    dtype = X.dtype.element_ty
    squares = tl.zeros([BLOCK_M], dtype=tl.float32)  # the RMSNorm's, from the x tiles the loop reads
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for i in tl.range(0, TILES):
        k = k_lo + i * BLOCK_K + kk
        if EVEN:
            w = tl.load(w_rows + k[None, :])
        else:
            w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & (k < K)[None, :], other=0.0)
        if PROLOGUE == 1:
            h = tl.load(X + m[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & (k < K)[None, :],
                        other=0.0).to(tl.float32)
            squares += tl.sum(h * h, 1)
            x = (h * tl.load(NormW + k, mask=k < K, other=0.0).to(tl.float32)[None, :]).to(dtype)
        else:  # [BLOCK_M, BLOCK_K], masked past K
            x = _rows_x(X, NormW, m, m_ok, k, stride_xm, squares, K, PROLOGUE)
        acc = tl.dot(w, tl.trans(x), acc)
    y = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    ok = m_ok[:, None] & n_ok[None, :]
    if PROLOGUE == 1:
        _keep_squares(Part, squares, pid_k, m, m_ok, M, N, SPLIT)
    y, last = _split_sum(y, Part, Arrived, pid, pid_k, m[:, None], n[None, :], ok, M, N, SPLIT)
    if PROLOGUE == 1:
        y = y * _split_rstd(squares, Part, m, m_ok, last, M, N, eps, K, SPLIT)[:, None]
    _rows_epilogue(y, Y, Bias, Res, m, n, n_ok, ok & last, stride_ym, stride_rm, HAS_BIAS, HAS_RES)


def _per_split(a) -> int:
    """Columns of W per split, a whole number of BLOCK_K tiles."""
    tiles = -(-a["K"] // a["BLOCK_K"])
    return -(-tiles // a["SPLIT"]) * a["BLOCK_K"]


_KERNEL = triton.heuristics({
    "PER_SPLIT": _per_split,
    "EVEN": lambda a: a["N"] % a["BLOCK_N"] == 0 and _per_split(a) * a["SPLIT"] == a["K"],
})(triton.jit(_skinny, do_not_specialize=["M"]))

SETTINGS: dict[tuple[int, int, int], tuple[int, int, int, int, int]] = {
    # Llama-3.2-3B's projections (wqkv, wo, w_gate_up, w_down, lm_head) at 16, 32 and 64-row tiles
    (16, 5120, 3072): (64, 256, 1, 4, 4), (32, 5120, 3072): (64, 256, 1, 4, 4), (64, 5120, 3072): (64, 256, 1, 4, 3),
    (16, 3072, 3072): (32, 256, 1, 4, 4), (32, 3072, 3072): (32, 256, 1, 4, 4), (64, 3072, 3072): (64, 128, 2, 4, 4),
    (16, 16384, 3072): (64, 64, 1, 4, 4), (32, 16384, 3072): (64, 128, 1, 4, 3), (64, 16384, 3072): (128, 64, 1, 4, 4),
    (16, 3072, 8192): (64, 64, 8, 4, 3), (32, 3072, 8192): (128, 128, 4, 4, 4), (64, 3072, 8192): (128, 64, 4, 4, 4),
    (16, 128256, 3072): (128, 64, 1, 4, 3), (32, 128256, 3072): (128, 64, 1, 4, 3),
    (64, 128256, 3072): (128, 64, 1, 4, 3),
}
"""(row tile, N, K) -> (BLOCK_N, BLOCK_K, SPLIT, warps, stages): the fastest setting of a sweep on
an H100 per shape (decode_rows results README)."""
# measured: begin (benchmarks/skinny_table.py rewrites these lines from a rows_bench run)
TAKEN: frozenset[tuple[int, int, int]] = frozenset({
    (16, 3072, 3072),
    (16, 3072, 8192),
    (16, 128256, 3072),
})
# measured: end
"""The (row tile, N, K) where the kernel at its setting beat the model's own matmul (cuBLAS) at every
row count measured in that tile; kiln.llm.decode_matvec takes the kernel for these shapes only."""
GPU_TABLES: dict[str, tuple[frozenset[tuple[int, int, int]], dict[tuple[int, int, int], tuple[int, int, int, int, int]]]] = {
    # measured (H200): begin (benchmarks/skinny_table.py --gpu H200 rewrites these lines from a rows_bench sweep)
    "H200": (frozenset({(32, 3072, 3072), (32, 128256, 3072)}),
             {(32, 3072, 3072): (64, 128, 2, 4, 4), (32, 128256, 3072): (128, 64, 1, 4, 4)}),
    # measured (H200): end
}
"""GPU name (a word of torch.cuda.get_device_name) -> (shapes it takes besides TAKEN, their settings):
the fastest of a sweep on that GPU where it beat cuBLAS alone, confirmed by the whole decode step."""
INTERPRETED_SETTING = (16, 32, 1, 4, 1)


def default_setting(rows: int, n: int, k: int, sms: int) -> tuple[int, int, int, int, int]:
    """The rule for shapes the table does not hold: 64-wide output blocks, 128-wide K tiles, and
    the fewest splits of K (at most MAX_SPLIT, each at least two tiles) that give every SM two programs."""
    bn, bk = 64, 128
    split = 1
    while -(-n // bn) * split < 2 * sms and split < MAX_SPLIT and k // (2 * split) >= 2 * bk:
        split *= 2
    return bn, bk, split, 4, 4


@torch._dynamo.assume_constant_result  # read once when a step is compiled, not traced into
def gpu_table_name(index: int) -> str:
    """The key of GPU_TABLES that CUDA device `index` is (a word of its name), or '' for none."""
    words = torch.cuda.get_device_name(index).replace("-", " ").split()
    return next((name for name in GPU_TABLES if name in words), "")


def device_table(device: torch.device) -> str:
    """`gpu_table_name` of a CUDA `device`; '' elsewhere (CPU, the Triton interpreter)."""
    if device.type != "cuda":
        return ""
    return gpu_table_name(device.index if device.index is not None else torch.cuda.current_device())


def table_setting(rows: int, n: int, k: int, gpu: str = "") -> tuple[int, int, int, int, int] | None:
    """The measured setting for this shape (on GPU_TABLES' `gpu`, its own first), or None where no
    table holds one."""
    if rows > MAX_ROWS:
        return None
    key = (block_m(rows), n, k)
    own = GPU_TABLES[gpu][1] if gpu else {}
    return own.get(key, SETTINGS.get(key))


def takes(rows: int, n: int, k: int, gpu: str = "") -> bool:
    """Whether a decode step's projection of `rows` rows by an [n, k] weight takes this kernel:
    TAKEN, and on GPU_TABLES' `gpu` its shapes too."""
    key = (block_m(rows), n, k)
    return 2 <= rows <= MAX_ROWS and (key in TAKEN or bool(gpu) and key in GPU_TABLES[gpu][0])


def launch(x: Tensor, weight: Tensor, bias: Tensor | None, norm_weight: Tensor | None, eps: float, silu_mul: bool,
           residual: Tensor | None, setting: list[int] | None) -> Tensor:
    x = x.contiguous()
    M = x.shape[0]
    N, K = weight.shape
    if M > MAX_ROWS:
        raise ValueError(f"skinny: {M} rows, more than MAX_ROWS={MAX_ROWS}")
    given = setting or (INTERPRETED_SETTING if interpreting() else table_setting(M, N, K, device_table(x.device)))
    if given is None:
        given = default_setting(M, N, K, torch.cuda.get_device_properties(x.device).multi_processor_count)
    bn, bk, split, warps, stages = (*given, 4, 4)[:5]
    prologue = 1 if norm_weight is not None else 2 if silu_mul else 0
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    # each split's partial sums, then its sums of squares per row (an RMSNorm's); unused without splits
    part = torch.empty(split * M * (N + 1) if split > 1 else 1, dtype=torch.float32, device=x.device)
    res = residual.contiguous() if residual is not None else None
    args = (x, weight, y, norm_weight, bias, res, part, arrival_counters(x.device, N), M, N, eps, x.stride(0),
            weight.stride(0), y.stride(0), res.stride(0) if res is not None else 0)
    pdl = pdl_enabled(x.device)
    flags = {"K": K, "PROLOGUE": prologue, "HAS_BIAS": bias is not None, "HAS_RES": res is not None, "PDL": pdl,
             "BLOCK_M": block_m(M)}
    if pdl:
        flags["launch_pdl"] = True
    _KERNEL[(triton.cdiv(N, bn), split)](*args, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split, num_warps=warps,
                                         num_stages=stages, **flags)
    return y


@torch.library.custom_op("kiln::skinny", mutates_args=())
def skinny(x: Tensor, weight: Tensor, bias: Tensor | None, norm_weight: Tensor | None, eps: float,
           silu_mul: bool, residual: Tensor | None, setting: list[int] | None = None) -> Tensor:
    """kiln::matvec's product for 2..MAX_ROWS rows (the same arguments): x [M, K] ([M, 2K] with
    `silu_mul`) times weight [N, K]^T -> [M, N]. `setting` (BLOCK_N, BLOCK_K, SPLIT[, warps,
    stages]) overrides the table and the rule (tests, benchmarks)."""
    return launch(x, weight, bias, norm_weight, eps, silu_mul, residual, setting)


@skinny.register_fake
def _(x, weight, bias, norm_weight, eps, silu_mul, residual, setting=None):
    return x.new_empty(x.shape[0], weight.shape[0])
