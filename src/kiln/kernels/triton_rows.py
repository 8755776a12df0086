"""kiln's int4 products for several rows at once (a decode step at batch > 1), written in Triton,
with the same fused parts as the one-row int4 kernel (kiln.kernels.triton_int4): an RMSNorm (or a
folded norm's 1/rms) or a SwiGLU before, the SwiGLU of interleaved gate/up rows after, a bias and
a residual add after. kiln.llm.int4_layout.int4_path decides at which row counts it runs.

A program owns a block of BLOCK_N outputs, a block of BLOCK_M rows and a split of K: it reads and
unpacks each weight tile once for all the block's rows and multiplies on the tensor cores
(`tl.dot`, rows padded to 16). The one-row kernel gives each row its own programs, which at batch
B read and unpack every weight tile B times. Per group of inputs (word [r, n] holds inputs
8r..8r+7 of output n) nibbles become MAGIC + q in the model dtype (q written into MAGIC's low
mantissa bits: no conversion instruction), and scale * (sum q x) + offset * (sum x) is applied
once per group and output, the MAGIC * sum x term removed with the offset's. Two loops
(kiln.kernels.int4_groups):

- SWAP (groups of 128 and more, the default there): the weight is the products' first operand, so
  the tensor cores read it from registers: the words are loaded into the operand's register
  layout and unpacked there, one product per nibble position j over the word rows (K = group/8)
  with the inputs 8r + j. In bf16 two words' nibbles become two bf16 pairs in a prmt and two
  lop3s (inline PTX). The rows are the products' second operand; the result is transposed once.
  The group's inputs are read once and each position's tile cut from them in registers
  (SWAP_X_ONCE), which lets Triton's pipeliner load them ahead with the words; the scales and
  offsets are read one group ahead (SWAP_SCALES_AHEAD).
- otherwise each group's words are unpacked into a [GROUP, BLOCK_N] tile, the second operand,
  which goes through shared memory on its way to the tensor cores: that round trip and the
  unpacking per value made this loop slower at 16 rows on every projection where both were measured.

A folded norm's 1/rms comes from the squares of the x tiles the loop reads (each split's, added
by the block's last program), not from a pass of its own.

Launch settings come from a rule (`choose_setting`), not from autotuning, so warm-up tunes
nothing and every process picks the same: 128-wide blocks of 16 rows, Triton's pipeliner, and the
fewest splits of K that give every SM PROGRAMS_PER_SM programs (docs/benchmarks.md lists the
sweeps behind these). Splits are added in a fixed order by the last program of a block to
arrive (kiln.kernels.triton_matvec._split_sum), so results do not depend on arrival order. With
programmatic dependent launch (Hopper) a program waits for the previous kernel before reading
anything, then lets the next kernel be scheduled. Dense
weights at batch > 1 take the model's own matmul (cuBLAS). Tests run the kernel on CPU through
Triton's interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kiln.kernels.int4_groups import _swapped_loop, _tile_loop
from kiln.kernels.triton_int4 import PROLOGUES
from kiln.kernels.triton_launch import arrival_counters, interpreting, pdl_enabled
from kiln.kernels.triton_matvec import _split_sum

MAX_ROWS = 64
"""Rows (batch x tokens) of a decode step: up to here blocks of DECODE_BLOCK_M rows, splits of K
allowed; longer inputs are tiled into row blocks of PREFILL_BLOCK_M."""
MAX_SPLIT = 8


def block_m(rows: int) -> int:
    """Rows padded to the tensor cores' smallest tile (16), then to a power of two."""
    return max(16, triton.next_power_of_2(rows))


@triton.jit
def _rows_rstd(X, m, m_ok, stride_xm, eps, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / rms of each row's K values, [BLOCK_M]."""
    kk = tl.arange(0, BLOCK_K)
    squares = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        h = tl.load(X + m[:, None] * stride_xm + (k0 + kk)[None, :], mask=m_ok[:, None] & ((k0 + kk) < K)[None, :],
                    other=0.0).to(tl.float32)
        squares += h * h
    return tl.rsqrt(tl.sum(squares, 1) / K + eps)


@triton.jit
def _keep_squares(Part, squares, pid_k, m, m_ok, M, N, SPLIT: tl.constexpr):
    """A norm folded into the loop: this split's sums of squares [BLOCK_M], stored after its partial
    products in `Part` for the block's last program (`_split_rstd`); nothing with one split."""
    if SPLIT > 1:
        tl.store(Part + SPLIT * M * N + pid_k * M + m, squares, mask=m_ok)


@triton.jit
def _split_rstd(squares, Part, m, m_ok, last, M, N, eps, K: tl.constexpr, SPLIT: tl.constexpr):
    """1 / rms of each row [BLOCK_M] from every split's sums of squares (`_keep_squares`; read by the
    block's last program, `last`), or from this program's own with one split."""
    if SPLIT > 1:
        squares = tl.zeros_like(squares)
        for s in tl.static_range(SPLIT):
            squares += tl.load(Part + SPLIT * M * N + s * M + m, mask=m_ok & last, other=0.0)
    return tl.rsqrt(squares / K + eps)


@triton.jit
def _rows_epilogue(y, Y, Bias, Res, m, n, n_ok, ok, stride_ym, stride_rm, HAS_BIAS: tl.constexpr,
                   HAS_RES: tl.constexpr):
    """+ bias, rounded, + residual, rounded, stored where `ok`."""
    dtype = Y.dtype.element_ty
    if HAS_BIAS:
        y += tl.load(Bias + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y = y.to(dtype)
    if HAS_RES:
        res = tl.load(Res + m[:, None] * stride_rm + n[None, :], mask=ok, other=0.0)
        y = (res.to(tl.float32) + y.to(tl.float32)).to(dtype)
    tl.store(Y + m[:, None] * stride_ym + n[None, :], y, mask=ok)


def _int4_rows(X, Q, Scale, Offset, Y, NormW, Bias, Res, Part, Arrived, M, N, eps,
               stride_xm, stride_ym, stride_rm,
               K: tl.constexpr, GROUP: tl.constexpr, PROLOGUE: tl.constexpr, SWIGLU: tl.constexpr,
               HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PDL: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, PER_SPLIT: tl.constexpr,
               PREFETCH: tl.constexpr, SWAP: tl.constexpr, ASM: tl.constexpr, X_ONCE: tl.constexpr,
               SCALES_AHEAD: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    m_blocks = tl.cdiv(M, BLOCK_M)
    pid_m = pid % m_blocks  # row blocks fastest: the programs sharing a weight tile run together (L2)
    pid_n = pid // m_blocks
    dtype = X.dtype.element_ty
    MAGIC: tl.constexpr = 0.0 if dtype == tl.float32 else 1024.0 if dtype == tl.float16 else 128.0
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < M
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if PROLOGUE == 1:  # an unfolded norm scales x before its product: the whole row's rms first
        rstd = _rows_rstd(X, m, m_ok, stride_xm, eps, K, BLOCK_M, 128)
    g0 = pid_k * PER_SPLIT
    if SWAP:
        acc, squares = _swapped_loop(X, Q, Scale, Offset, NormW, g0, m, m_ok, n, n_ok, stride_xm, rstd, N, K, GROUP,
                                     PROLOGUE, ASM, BLOCK_M, BLOCK_N, PER_SPLIT, MAGIC, X_ONCE, SCALES_AHEAD)
    else:
        acc, squares = _tile_loop(X, Q, Scale, Offset, NormW, g0, m, m_ok, n, n_ok, stride_xm, rstd, N, K, GROUP,
                                  PROLOGUE, BLOCK_M, BLOCK_N, PER_SPLIT, PREFETCH, MAGIC)
    ok = m_ok[:, None] & n_ok[None, :]
    if PROLOGUE == 3:
        _keep_squares(Part, squares, pid_k, m, m_ok, M, N, SPLIT)
    y, last = _split_sum(acc, Part, Arrived, pid, pid_k, m[:, None], n[None, :], ok, M, N, SPLIT)
    if PROLOGUE == 3:
        y = y * _split_rstd(squares, Part, m, m_ok, last, M, N, eps, K, SPLIT)[:, None]
    if SWIGLU:  # rows of the weight are gate, up, gate, up, ...: write silu(gate) * up
        if HAS_BIAS:
            y += tl.load(Bias + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        y = y.to(dtype)
        gate, up = tl.split(tl.reshape(y, [BLOCK_M, BLOCK_N // 2, 2]))
        gate = gate.to(tl.float32)
        act = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
        act = (act * up.to(tl.float32)).to(dtype)
        h = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(Y + m[:, None] * stride_ym + h[None, :], act, mask=m_ok[:, None] & (h < N // 2)[None, :] & last)
    else:
        _rows_epilogue(y, Y, Bias, Res, m, n, n_ok, ok & last, stride_ym, stride_rm, HAS_BIAS, HAS_RES)


PREFILL_BLOCK_M = 128
INTERPRETED_INT4 = (16, 1)
SWEEP_SETTINGS = [(bn, split) for bn in (32, 64, 128) for split in (1, 2, 4, 8)]
"""(BLOCK_N, SPLIT) pairs benchmarks sweep around `choose_setting`'s pick."""


def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


DECODE_BLOCK_N = 128
DECODE_BLOCK_M = 16
DECODE_STAGES = 3
DECODE_WARPS = 4
DECODE_PREFETCH = 0
"""The rule's decode setting (BLOCK_N, BLOCK_M, Triton pipeliner stages, warps, no register prefetch)."""
SWAP_X_ONCE = True
"""The SWAP loop reads each group's inputs once and cuts the eight nibble positions' tiles from them
in registers; False reads each position's tile (a strided gather) before its product."""
SWAP_SCALES_AHEAD = True
"""The SWAP loop reads each group's scales and offsets one group ahead; False, in the group they serve."""
PROGRAMS_PER_SM = 2
"""Decode products are split along K until they give every SM this many programs (MAX_SPLIT at most)."""
SWAP_FROM_GROUP = 128
"""Group sizes from which the weight is the products' first operand (`_swapped_loop`); smaller
groups (and a setting's SWAP of 0) unpack into the second operand's tile (`_tile_loop`)."""


def choose_setting(rows: int, n: int, k: int, group: int, sms: int) -> tuple[int, int, int, int, int, int, int]:
    """(BLOCK_N, SPLIT, warps, stages, BLOCK_M, PREFETCH, SWAP) for a product of `rows` rows by an [n, k]
    weight, by rule instead of autotuning (no tuning at warm-up, the same choice in every process):
    above MAX_ROWS rows (prefill) 128 x 128 tiles, 8 warps, no splits; else DECODE_BLOCK_N-wide
    blocks of `row_block` rows, and the fewest splits of K that give every SM PROGRAMS_PER_SM programs."""
    swap = int(group >= SWAP_FROM_GROUP)
    if rows > MAX_ROWS:
        return 128, 1, 8, 3, PREFILL_BLOCK_M, 0, swap
    blocks = -(-rows // row_block(rows)) * -(-n // DECODE_BLOCK_N)
    split = 1
    while blocks * split < PROGRAMS_PER_SM * sms and split < min(MAX_SPLIT, k // group):
        split *= 2
    return DECODE_BLOCK_N, split, DECODE_WARPS, DECODE_STAGES, row_block(rows), DECODE_PREFETCH, swap


def _run(args: tuple, flags: dict, M: int, N: int, setting: tuple) -> None:
    bn, split, warps, stages = setting
    if flags["PDL"]:
        flags["launch_pdl"] = True
    blocks = triton.cdiv(M, flags["BLOCK_M"])
    _KERNEL[(blocks * triton.cdiv(N, bn), split)](*args, BLOCK_N=bn, SPLIT=split, num_warps=warps, num_stages=stages,
                                                   **flags)


_KERNEL = triton.heuristics({"PER_SPLIT": lambda a: -(-(a["K"] // a["GROUP"]) // a["SPLIT"])})(
    triton.jit(_int4_rows, do_not_specialize=["M"]))


def row_block(rows: int) -> int:
    """The rows one program covers by default: all of them up to DECODE_BLOCK_M (`block_m`), else
    blocks of DECODE_BLOCK_M up to MAX_ROWS rows and of PREFILL_BLOCK_M above."""
    return min(block_m(rows), DECODE_BLOCK_M) if rows <= MAX_ROWS else PREFILL_BLOCK_M


def int4_rows(x: Tensor, packed: Tensor, scale: Tensor, offset: Tensor, group_size: int, bias: Tensor | None,
              norm_weight: Tensor | None, eps: float, prologue: int, swiglu: bool, residual: Tensor | None,
              setting: list[int] | None = None) -> Tensor:
    """kiln::int4_matvec's product for M >= 1 rows (`prologue` as its codes). `setting` (BLOCK_N,
    SPLIT[, warps, stages[, BLOCK_M[, PREFETCH[, SWAP]]]]) overrides `choose_setting`; SWAP applies
    from SWAP_FROM_GROUP, PREFETCH to the other loop only."""
    x = x.contiguous()
    M = x.shape[0]
    KW, N = packed.shape
    given = setting or (INTERPRETED_INT4 if interpreting() else None)
    if given is None:
        given = choose_setting(M, N, 8 * KW, group_size, _sms(x.device))
    swap_default = int(group_size >= SWAP_FROM_GROUP)
    bn, split, warps, stages, bm, prefetch, swap = (*given, *(4, 2, row_block(M), 1, swap_default)[len(given) - 2:])
    swap = bool(swap) and group_size >= SWAP_FROM_GROUP
    if split > 1 and triton.cdiv(M, bm) * triton.cdiv(N, bn) > N:
        raise ValueError(f"int4_rows: {M} rows in blocks of {bm} with splits of K need more arrival counters than {N}")
    y = torch.empty(M, N // 2 if swiglu else N, dtype=x.dtype, device=x.device)
    # each split's partial sums, then its sums of squares per row (a folded norm's); unused without splits
    part = torch.empty(split * M * (N + 1) if split > 1 else 1, dtype=torch.float32, device=x.device)
    res = residual.contiguous() if residual is not None else None
    args = (x, packed, scale, offset, y, norm_weight, bias, res, part, arrival_counters(x.device, N), M, N, eps,
            x.stride(0), y.stride(0), res.stride(0) if res is not None else 0)
    flags = {"K": 8 * KW, "GROUP": group_size, "PROLOGUE": prologue, "SWIGLU": swiglu, "HAS_BIAS": bias is not None,
             "HAS_RES": res is not None, "PDL": pdl_enabled(x.device), "BLOCK_M": bm, "PREFETCH": bool(prefetch),
             "SWAP": swap, "ASM": swap and x.dtype == torch.bfloat16 and not interpreting(), "X_ONCE": SWAP_X_ONCE,
             "SCALES_AHEAD": SWAP_SCALES_AHEAD}
    _run(args, flags, M, N, (bn, split, warps, stages))
    return y


@torch.library.custom_op("kiln::int4_rows", mutates_args=())
def int4_rows_op(x: Tensor, packed: Tensor, scale: Tensor, offset: Tensor, group_size: int, bias: Tensor | None = None,
                 norm_weight: Tensor | None = None, eps: float = 0.0, prologue: str = "none", swiglu: bool = False,
                 residual: Tensor | None = None, setting: list[int] | None = None) -> Tensor:
    """`int4_rows` as an opaque op for torch.compile (kiln::int4_matvec's arguments)."""
    return int4_rows(x, packed, scale, offset, group_size, bias, norm_weight, eps, PROLOGUES[prologue], swiglu,
                     residual, setting)


@int4_rows_op.register_fake
def _(x, packed, scale, offset, group_size, bias=None, norm_weight=None, eps=0.0, prologue="none", swiglu=False,
      residual=None, setting=None):
    return x.new_empty(x.shape[0], packed.shape[1] // 2 if swiglu else packed.shape[1])
