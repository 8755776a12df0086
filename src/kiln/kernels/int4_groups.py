"""How int4@triton's row kernel (kiln.kernels.triton_rows) multiplies a split's groups of inputs: the
input tiles with the prologue applied as eager rounds it, the int4 words as tensor-core operands
(MAGIC + q in the model dtype, q written into MAGIC's low mantissa bits), and its two loops over a
split's groups (kiln.kernels.triton_rows' docstring says when each runs). Triton functions only;
the kernel, its settings and its launch are kiln.kernels.triton_rows'.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kiln.kernels.triton_matvec import _x_tile


@triton.jit
def _rows_x(X, NormW, m, m_ok, k, stride_xm, rstd, K: tl.constexpr, PROLOGUE: tl.constexpr):
    """The [BLOCK_M, len(k)] input tile in the model dtype, the prologue applied as eager rounds it."""
    at = X + m[:, None] * stride_xm + k[None, :]
    x = _x_tile(at, NormW, k[None, :], m_ok[:, None] & (k < K)[None, :], rstd[:, None], K, PROLOGUE)
    return x.to(X.dtype.element_ty)


@triton.jit
def _group_tiles(X, Q, Scale, Offset, NormW, g, m, m_ok, n, n_ok, r, stride_xm, rstd, N, K: tl.constexpr,
                 GROUP: tl.constexpr, PROLOGUE: tl.constexpr):
    """Group g's words [RP, BLOCK_N], scales and offsets [BLOCK_N] and inputs [BLOCK_M, 8 RP] (the
    prologue applied; the padding past GROUP reads as 0)."""
    R: tl.constexpr = GROUP // 8
    RP: tl.constexpr = max(2, R)
    GROUPS: tl.constexpr = K // GROUP
    g_ok = g < GROUPS
    words = tl.load(Q + (g * R + r)[:, None] * N + n[None, :], mask=g_ok & (r < R)[:, None] & n_ok[None, :], other=0)
    scale = tl.load(Scale + g * N + n, mask=g_ok & n_ok, other=0.0).to(tl.float32)
    offset = tl.load(Offset + g * N + n, mask=g_ok & n_ok, other=0.0).to(tl.float32)
    k = g * GROUP + tl.arange(0, 8 * RP)
    x = _rows_x(X, NormW, m, m_ok & g_ok, tl.where(k < g * GROUP + GROUP, k, K), stride_xm, rstd, K,
                PROLOGUE if PROLOGUE != 3 else 0)
    return words, scale, offset, x


@triton.jit
def _as_magic(q, dtype: tl.constexpr):
    """int32 values q in [0, 15] as MAGIC + q in `dtype`, exact: in 16-bit types q goes into the low
    mantissa bits of MAGIC's bit pattern (an and-or, no int-to-float conversion); fp32 (tests)
    converts q itself, MAGIC 0."""
    if dtype == tl.float32:
        return q.to(tl.float32)
    if dtype == tl.float16:
        return (q | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)  # 1024 + q
    return (q | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)  # 128 + q


@triton.jit
def _unpacked(words, dtype: tl.constexpr):
    """words [RP, BLOCK_N] -> [8 RP, BLOCK_N] of MAGIC + q in `dtype` (input 8r + j: nibble j of word row r)."""
    shifts = 4 * tl.arange(0, 8)
    q = (words[:, None, :] >> shifts[None, :, None]) & 15  # [RP, 8, BLOCK_N]
    return _as_magic(tl.reshape(q, [8 * words.shape[0], words.shape[1]]), dtype)


@triton.jit
def _nibble_pair(words, B: tl.constexpr, dtype: tl.constexpr, ASM: tl.constexpr):
    """Nibbles 2B and 2B+1 of each word as MAGIC + q in `dtype` (two tensors shaped as `words`).
    ASM (bf16 on a GPU): two words' byte B are gathered into one register (prmt) and each nibble
    of the pair becomes two bf16 values in one and-or (lop3): fewer instructions than the plain ops."""
    if ASM:
        if B == 0:
            sel: tl.constexpr = "0x0400"
        elif B == 1:
            sel: tl.constexpr = "0x0501"
        elif B == 2:
            sel: tl.constexpr = "0x0602"
        else:
            sel: tl.constexpr = "0x0703"
        return tl.inline_asm_elementwise(
            asm="{ .reg .b32 t; prmt.b32 t, $2, $3, " + sel + "; lop3.b32 $0, t, 0x000F000F, 0x43004300, 0xea; "
                "shr.b32 t, t, 4; lop3.b32 $1, t, 0x000F000F, 0x43004300, 0xea; }",
            constraints="=r,=r,r,r", args=[words], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)
    return _as_magic((words >> (8 * B)) & 15, dtype), _as_magic((words >> (8 * B + 4)) & 15, dtype)


@triton.jit
def _rows_xt(X, NormW, m, m_ok, k, stride_xm, rstd, K: tl.constexpr, PROLOGUE: tl.constexpr):
    """The input tile transposed, [len(k), BLOCK_M], in the model dtype, the prologue applied."""
    at = X + m[None, :] * stride_xm + k[:, None]
    x = _x_tile(at, NormW, k[:, None], (k < K)[:, None] & m_ok[None, :], rstd[None, :], K, PROLOGUE)
    return x.to(X.dtype.element_ty)


@triton.jit
def _by_nibble(xg, R: tl.constexpr, BLOCK_M: tl.constexpr):
    """A group's input tile [BLOCK_M, 8 R] as the eight [R, BLOCK_M] tiles of inputs 8r + j, j = 0..7."""
    xr = tl.permute(tl.reshape(xg, [BLOCK_M, R, 8]), (1, 0, 2))  # [r, m, j]
    even, odd = tl.split(tl.reshape(xr, [R, BLOCK_M, 4, 2]))  # j = 2q, 2q + 1: [r, m, q]
    e02, e13 = tl.split(tl.reshape(even, [R, BLOCK_M, 2, 2]))  # q in (0, 2), (1, 3)
    o02, o13 = tl.split(tl.reshape(odd, [R, BLOCK_M, 2, 2]))
    x0, x4 = tl.split(e02)
    x2, x6 = tl.split(e13)
    x1, x5 = tl.split(o02)
    x3, x7 = tl.split(o13)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _swapped_group(X, Q, NormW, g, g_ok, m, m_ok, n, n_ok, stride_xm, rstd, N, K: tl.constexpr, GROUP: tl.constexpr,
                   PROLOGUE: tl.constexpr, ASM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   X_ONCE: tl.constexpr):
    """Group g's product transposed, sum_k q_k x_k as [BLOCK_N, BLOCK_M] with q read as MAGIC + q,
    and the inputs' sums and sums of squares per row [BLOCK_M]: the weight is the products' first
    operand, unpacked in the registers the tensor cores read it from (no shared-memory round trip);
    one product per nibble position j, over the word rows, with the inputs 8r + j."""
    R: tl.constexpr = GROUP // 8
    r = tl.arange(0, R)
    dtype = X.dtype.element_ty
    prologue: tl.constexpr = PROLOGUE if PROLOGUE != 3 else 0
    words = tl.load(Q + (g * R + r)[None, :] * N + n[:, None], mask=g_ok & n_ok[:, None], other=0)  # [BN, R]
    # the sums from the group's inputs read in order (one reduction across threads each), the
    # products from the same values read by nibble position (cache hits)
    xg = _rows_x(X, NormW, m, m_ok & g_ok, g * GROUP + tl.arange(0, GROUP), stride_xm, rstd, K, prologue)
    xf = xg.to(tl.float32)
    xsum = tl.sum(xf, 1)
    squares = tl.sum(xf * xf, 1) if PROLOGUE == 3 else xsum
    part = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    if X_ONCE:  # the eight nibble positions' inputs cut from the tile read above, not read again
        x0, x1, x2, x3, x4, x5, x6, x7 = _by_nibble(xg, R, BLOCK_M)
        lo, hi = _nibble_pair(words, 0, dtype, ASM)
        part = tl.dot(hi, x1, tl.dot(lo, x0, part))
        lo, hi = _nibble_pair(words, 1, dtype, ASM)
        part = tl.dot(hi, x3, tl.dot(lo, x2, part))
        lo, hi = _nibble_pair(words, 2, dtype, ASM)
        part = tl.dot(hi, x5, tl.dot(lo, x4, part))
        lo, hi = _nibble_pair(words, 3, dtype, ASM)
        return tl.dot(hi, x7, tl.dot(lo, x6, part)), xsum, squares
    for b in tl.static_range(4):
        lo, hi = _nibble_pair(words, b, dtype, ASM)
        part = tl.dot(lo, _rows_xt(X, NormW, m, m_ok & g_ok, g * GROUP + 8 * r + 2 * b, stride_xm, rstd, K, prologue),
                      part)
        part = tl.dot(hi, _rows_xt(X, NormW, m, m_ok & g_ok, g * GROUP + 8 * r + 2 * b + 1, stride_xm, rstd, K,
                                   prologue), part)
    return part, xsum, squares


@triton.jit
def _tile_loop(X, Q, Scale, Offset, NormW, g0, m, m_ok, n, n_ok, stride_xm, rstd, N, K: tl.constexpr,
               GROUP: tl.constexpr, PROLOGUE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               PER_SPLIT: tl.constexpr, PREFETCH: tl.constexpr, MAGIC: tl.constexpr):
    """A split's sum [BLOCK_M, BLOCK_N] and the rows' sums of squares, each group's words unpacked
    into a [GROUP, BLOCK_N] tile, the products' second operand (any group size)."""
    R: tl.constexpr = GROUP // 8  # word rows per group
    RP: tl.constexpr = max(2, R)  # 8 RP >= 16: the tensor cores' smallest K
    r = tl.arange(0, RP)
    dtype = X.dtype.element_ty
    squares = tl.zeros([BLOCK_M], dtype=tl.float32)  # a folded norm's: from the x tiles the loop reads
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    last_g = g0 + PER_SPLIT - 1
    # PREFETCH: the next group's tiles are requested before this one is computed (the last reloads its
    # own: an L2 hit); else Triton's pipeliner (num_stages) schedules the loads.
    words, scale, offset, x = _group_tiles(X, Q, Scale, Offset, NormW, g0, m, m_ok, n, n_ok, r, stride_xm, rstd, N, K,
                                           GROUP, PROLOGUE)
    for i in tl.range(0, PER_SPLIT):
        g = g0 + i
        if PREFETCH:
            words_n, scale_n, offset_n, x_n = _group_tiles(X, Q, Scale, Offset, NormW, tl.minimum(g + 1, last_g), m,
                                                           m_ok, n, n_ok, r, stride_xm, rstd, N, K, GROUP, PROLOGUE)
        else:
            words, scale, offset, x = _group_tiles(X, Q, Scale, Offset, NormW, g, m, m_ok, n, n_ok, r, stride_xm,
                                                   rstd, N, K, GROUP, PROLOGUE)
        # y = scale * sum_k q_k x_k + offset * sum_k x_k per group; the tile holds MAGIC + q, whose
        # product is corrected by MAGIC * sum_k x_k with the offset's term.
        xf = x.to(tl.float32)
        xsum = tl.sum(xf, 1)
        if PROLOGUE == 3:
            squares += tl.sum(xf * xf, 1)
        part = tl.dot(x, _unpacked(words, dtype))
        acc += part * scale[None, :] + xsum[:, None] * (offset - MAGIC * scale)[None, :]
        if PREFETCH:
            words, scale, offset, x = words_n, scale_n, offset_n, x_n
    return acc, squares


@triton.jit
def _swapped_loop(X, Q, Scale, Offset, NormW, g0, m, m_ok, n, n_ok, stride_xm, rstd, N, K: tl.constexpr,
                  GROUP: tl.constexpr, PROLOGUE: tl.constexpr, ASM: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, PER_SPLIT: tl.constexpr, MAGIC: tl.constexpr, X_ONCE: tl.constexpr,
                  SCALES_AHEAD: tl.constexpr):
    """`_tile_loop`'s result through `_swapped_group` (groups of 128 inputs or more: a product's K
    of 16 word rows at least), computed as [BLOCK_N, BLOCK_M] and transposed once at the end.
    SCALES_AHEAD: each group's scales and offsets are read one group ahead (Triton's pipeliner
    leaves these loads, used after the products only, in the group they serve)."""
    squares = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    GROUPS: tl.constexpr = K // GROUP
    scale_next = tl.load(Scale + g0 * N + n, mask=(g0 < GROUPS) & n_ok, other=0.0)
    offset_next = tl.load(Offset + g0 * N + n, mask=(g0 < GROUPS) & n_ok, other=0.0)
    for i in tl.range(0, PER_SPLIT):
        g = g0 + i
        g_ok = g < GROUPS
        if SCALES_AHEAD:
            scale, offset = scale_next.to(tl.float32), offset_next.to(tl.float32)
            ahead = (g + 1 < GROUPS) & (i + 1 < PER_SPLIT)
            scale_next = tl.load(Scale + (g + 1) * N + n, mask=ahead & n_ok, other=0.0)
            offset_next = tl.load(Offset + (g + 1) * N + n, mask=ahead & n_ok, other=0.0)
        else:
            scale = tl.load(Scale + g * N + n, mask=g_ok & n_ok, other=0.0).to(tl.float32)
            offset = tl.load(Offset + g * N + n, mask=g_ok & n_ok, other=0.0).to(tl.float32)
        part, xsum, sq = _swapped_group(X, Q, NormW, g, g_ok, m, m_ok, n, n_ok, stride_xm, rstd, N, K, GROUP,
                                        PROLOGUE, ASM, BLOCK_M, BLOCK_N, X_ONCE)
        squares += sq
        acc += part * scale[:, None] + xsum[None, :] * (offset - MAGIC * scale)[:, None]
    return tl.trans(acc), squares
