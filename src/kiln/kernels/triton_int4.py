"""int4 decode matmuls in Triton (`--quant int4@triton`): the kernel for kiln's own int4 layout, with
the RMSNorm before a projection, the residual add after it and the MLP's SwiGLU fused in (the
layer and its packing: kiln.llm.int4_layout).

Layout (`Int4TritonLinear`): 4-bit asymmetric groups of `group_size` inputs along K (w = q *
scale + offset, q in [0, 15]), packed eight to an int32 word *down K*: word [r, n] holds the
inputs 8r..8r+7 of output n (input 8r+j in bits 4j..4j+3), stored [K/8, N] with N contiguous;
scales and offsets [K/group, N]. A program (row of x, block of BLOCK_N outputs, split of K) reads
one group per step: a tile of words laid out [group/8, BLOCK_N/32, 32] so that Triton gives each
thread one word row and 8-32 columns of it (as [group/8, BLOCK_N] it gave each two or four rows):
the eight x values of a word row are loaded and prepared once per thread for all its columns.
The steps of a split (at most 8) are unrolled, so the groups in flight need no register moves.

A nibble becomes a float without a conversion instruction and without the usual magic-number
subtraction: masked in place (bits s..s+3, s <= 16, the three top nibbles shifted down by 12
first, one shift per word) its bits read as an fp32 denormal equal to q * 2^(s-149) exactly, and
the FMA multiplies it by x * 2^(100-s) (a power of two, exact), so each input costs one logical
op and one FMA, and every product carries the same factor 2^-49, removed once per output. Per
group sum_k (q_k scale + offset) x_k = scale sum_k q_k x_k + offset sum_k x_k: the scale is
applied once per word, the offset once per group and output. No step goes through shared memory.

Fused parts (fixed at compile time):
- prologue `rms`: the model's RMSNorm weight was folded into this weight when it was quantized
  (kiln.llm.quant, int4@triton), so the norm is one scalar per row, 1/rms(h), applied to
  the output: y = rstd * (W diag(norm_w)) h. `rmsnorm` (an unfolded weight) and `silu_mul`
  prologues are computed per x value, as in kiln.kernels.triton_matvec;
- epilogue `swiglu`: the layer's rows are gate and up interleaved (gate j, up j, ...), and the
  kernel writes silu(gate) * up, half as many outputs, rounded as eager rounds each step; so the
  down projection's input is ready and its kernel has no prologue;
- + bias, + a residual.
Splits of K and their ordered reduction and the autotuned settings work as in
kiln.kernels.triton_matvec; besides, up to DEPTH groups of weights and the next group's x values are in
flight per program. With programmatic dependent launch a program reads its first DEPTH groups
before waiting for the previous kernel and lets the next kernel launch after that wait. Longer
inputs (prefill) dequantize the weight and call `linear`. Tests run it on CPU through Triton's
interpreter (TRITON_INTERPRET=1).

Why: a batch-1 int4 decode step is bound by latency more than bytes: each projection of a few
MB is a chain per program of its groups' arithmetic, a split reduction and the wait for the
previous kernel, so the kernel keeps the arithmetic per input to a logical op and an FMA, keeps
several groups in flight and fuses the work around the matmul instead of launching it.
The measurements are in the decode_matvec results README.
"""

from __future__ import annotations

import inspect

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kiln.kernels.triton_launch import arrival_counters, fixed_setting, interpreting, pdl_enabled, settings_launched
from kiln.kernels.triton_matvec import _split_sum, _x_tile

PROLOGUES = {"none": 0, "rmsnorm": 1, "silu_mul": 2, "rms": 3}
"""Prologue codes: 1 and 2 as kiln.kernels.triton_matvec's; 3 the folded norm (a scalar per row)."""
FACTOR_LOG2 = 49
"""Every product q * x in the loop carries 2^-FACTOR_LOG2 (see the module docstring)."""


@triton.jit
def _nibble(w, upper, J: tl.constexpr):
    """Nibble J of the words w in place, read as fp32: q * 2^(s-149), s its bit position (<= 16)."""
    S: tl.constexpr = 4 * J - 12 * (J // 5)
    if J < 5:
        return (w & (15 << S)).to(tl.float32, bitcast=True)
    return (upper & (15 << S)).to(tl.float32, bitcast=True)


@triton.jit
def _exp_add(raw, J: tl.constexpr):
    """bf16 values `raw` times 2^E in fp32, E = 100 - s (s as in `_nibble`), by adding E to the
    exponent as they are widened (a bf16's bits are the top half of its fp32): exact for normal
    values; a zero or subnormal becomes at most 2^(E-126), whose product with a nibble (< 2^-129
    with s <= 16) rounds to zero."""
    E: tl.constexpr = 100 - 4 * J + 12 * (J // 5)
    return (raw.to(tl.float32).to(tl.int32, bitcast=True) + (E << 23)).to(tl.float32, bitcast=True)


@triton.jit
def _scaled_x(x_at, NormW, k, ok, rstd, K: tl.constexpr, PROLOGUE: tl.constexpr, J: tl.constexpr):
    """`_x_tile`'s x (the prologue applied) at the inputs k of nibble J, times 2^(100 - s)."""
    E: tl.constexpr = 100 - 4 * J + 12 * (J // 5)
    return _x_tile(x_at, NormW, k, ok, rstd, K, PROLOGUE) * (2.0 ** E)


@triton.jit
def _x_raw8(at, ok):
    """The eight x values of each word row (`at`: pointers to their first), as stored."""
    return (tl.load(at, mask=ok, other=0.0), tl.load(at + 1, mask=ok, other=0.0), tl.load(at + 2, mask=ok, other=0.0),
            tl.load(at + 3, mask=ok, other=0.0), tl.load(at + 4, mask=ok, other=0.0), tl.load(at + 5, mask=ok, other=0.0),
            tl.load(at + 6, mask=ok, other=0.0), tl.load(at + 7, mask=ok, other=0.0))


@triton.jit
def _pick(J: tl.constexpr, x0, x1, x2, x3, x4, x5, x6, x7):
    if J == 0:
        return x0
    elif J == 1:
        return x1
    elif J == 2:
        return x2
    elif J == 3:
        return x3
    elif J == 4:
        return x4
    elif J == 5:
        return x5
    elif J == 6:
        return x6
    else:
        return x7


@triton.jit
def _rstd(x_row, eps, K: tl.constexpr, K_CHUNK: tl.constexpr):
    """1 / rms of the row's K values (every split needs the whole row's)."""
    squares = tl.zeros([K_CHUNK], dtype=tl.float32)
    kk = tl.arange(0, K_CHUNK)
    for k0 in tl.static_range(0, K, K_CHUNK):
        h = tl.load(x_row + k0 + kk, mask=(k0 + kk) < K, other=0.0).to(tl.float32)
        squares += h * h
    return tl.rsqrt(tl.sum(squares, 0) / K + eps)


@triton.jit
def _words(at, n_ok, g_ok, EVEN: tl.constexpr):
    if EVEN:
        return tl.load(at)
    return tl.load(at, mask=n_ok & g_ok, other=0)


def _int4_matvec(X, Q, Scale, Offset, Y, NormW, Bias, Res, Part, Arrived, M, N, eps,
                 stride_xm, stride_ym, stride_rm,
                 K: tl.constexpr, GROUP: tl.constexpr, PROLOGUE: tl.constexpr, SWIGLU: tl.constexpr,
                 HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PDL: tl.constexpr,
                 BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, DEPTH: tl.constexpr, PER_SPLIT: tl.constexpr,
                 EVEN: tl.constexpr, K_CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    row = pid % M  # rows fastest: the programs of one block's rows share its tiles through L2
    R: tl.constexpr = GROUP // 8  # word rows per group
    GROUPS: tl.constexpr = K // GROUP
    n = (pid // M) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    # The tile is [R, B, C]: output n0 + b*C + c, word row r. Triton spreads C over 8 threads (4 words
    # each) and R over the other 4 threads of a warp and the warps, so each thread holds one word row
    # of B*4 outputs: the row's 8 x values are loaded and scaled once per thread for all of them.
    C: tl.constexpr = min(32, BLOCK_N)
    B: tl.constexpr = BLOCK_N // C
    cols = (pid // M) * BLOCK_N + tl.arange(0, B)[None, :, None] * C + tl.arange(0, C)[None, None, :]  # [1, B, C]
    col_ok = cols < N
    r = tl.arange(0, R)
    r3 = r[:, None, None]
    dtype = X.dtype.element_ty
    x_row = X + row * stride_xm
    q_tile = Q + r3 * N + cols  # group g's words at + g * R * N
    g0 = pid_k * PER_SPLIT
    # DEPTH groups of weights in flight (no earlier kernel writes weights: read before the wait);
    # past the split's last group a program reloads that one (an L2 hit) instead of masking.
    last_g = g0 + PER_SPLIT - 1
    w = _words(q_tile + g0 * R * N, col_ok, g0 < GROUPS, EVEN)
    w1 = w
    w2 = w
    if DEPTH >= 2:
        g1 = tl.minimum(g0 + 1, last_g)
        w1 = _words(q_tile + g1 * R * N, col_ok, g1 < GROUPS, EVEN)
    if DEPTH >= 3:
        g2 = tl.minimum(g0 + 2, last_g)
        w2 = _words(q_tile + g2 * R * N, col_ok, g2 < GROUPS, EVEN)
    if PDL:
        # The next kernel is let in only once this one's input is ready (the previous kernel has
        # ended), not at once: let in at the start, each kernel would let the next launch early too,
        # and with int4's short kernels the weights of the projections two and three ahead would be
        # requested while the fused attention reads its keys and values, slowing it.
        gdc_wait()
        gdc_launch_dependents()
    # FAST: plain bf16 x (no prologue per value): its values are loaded one group ahead too, and a
    # folded norm's 1/rms is computed after the loop (only the output needs it).
    FAST: tl.constexpr = (PROLOGUE == 0 or PROLOGUE == 3) and X.dtype.element_ty == tl.bfloat16
    rstd = 0.0
    if PROLOGUE == 1:
        rstd = _rstd(x_row, eps, K, K_CHUNK)
    if FAST:
        k = g0 * GROUP + 8 * r
        x0, x1, x2, x3, x4, x5, x6, x7 = _x_raw8(x_row + k, (k < K) & (g0 < GROUPS))
    acc = tl.zeros([R, B, C], dtype=tl.float32)
    for i in tl.range(0, PER_SPLIT, loop_unroll_factor=PER_SPLIT if PER_SPLIT <= 8 else DEPTH):
        g = g0 + i
        nxt = tl.minimum(g + DEPTH, last_g)
        w_next = _words(q_tile + nxt * R * N, col_ok, nxt < GROUPS, EVEN)
        g_ok = g < GROUPS
        # [R, B, C] pointers, equal down a column: the tile's own layout, no shared-memory copy
        s_at = tl.broadcast_to(Scale + g * N + cols, [R, B, C])
        o_at = tl.broadcast_to(Offset + g * N + cols, [R, B, C])
        if EVEN:
            scale = tl.load(s_at).to(tl.float32)
            offset = tl.load(o_at).to(tl.float32)
        else:
            scale = tl.load(s_at, mask=(col_ok & g_ok) | (r3 < 0), other=0.0).to(tl.float32)
            offset = tl.load(o_at, mask=(col_ok & g_ok) | (r3 < 0), other=0.0).to(tl.float32)
        k = g * GROUP + 8 * r  # [R]: the first input of each word row
        k_ok = g_ok & (k < K)
        upper = w >> 12  # the top three nibbles down to bits 8..19
        part = tl.zeros([R, B, C], dtype=tl.float32)
        xs = tl.zeros([R], dtype=tl.float32)  # sum of the row's x values, times 2^-49
        if FAST:  # the next group's x values, in flight while this group is computed
            kn = tl.minimum(g + 1, last_g) * GROUP + 8 * r
            n0, n1, n2, n3, n4, n5, n6, n7 = _x_raw8(x_row + kn, (kn < K) & (g + 1 < GROUPS))
        for j in tl.static_range(8):
            # nibble j sits at bit s = 4j of w (j < 5) or 4j - 12 of upper: q 2^(s-149) x 2^(100-s) = q x 2^-49
            if FAST:
                xj = _exp_add(_pick(j, x0, x1, x2, x3, x4, x5, x6, x7), j)
            else:
                xj = _scaled_x(x_row + k + j, NormW, k + j, k_ok, rstd, K, PROLOGUE, j)
            xs += xj * (2.0 ** (4 * j - 12 * (j // 5) - 149))
            part += _nibble(w, upper, j) * xj[:, None, None]
        if FAST:
            x0, x1, x2, x3, x4, x5, x6, x7 = n0, n1, n2, n3, n4, n5, n6, n7
        acc = tl.fma(part, scale, acc)  # two FMAs per word
        acc = tl.fma(offset, xs[:, None, None], acc)
        if DEPTH == 1:
            w = w_next
        elif DEPTH == 2:
            w = w1
            w1 = w_next
        else:
            w = w1
            w1 = w2
            w2 = w_next
    y = tl.reshape(tl.sum(acc, 0), [BLOCK_N]) * (2.0 ** 49)  # [BLOCK_N]: n0 + b*C + c
    if PROLOGUE == 3:
        rstd = _rstd(x_row, eps, K, K_CHUNK)
    y, last = _split_sum(y, Part, Arrived, pid, pid_k, row, n, n_ok, M, N, SPLIT)
    ok = n_ok & last
    if PROLOGUE == 3:
        y = y * rstd
    if HAS_BIAS:
        y += tl.load(Bias + n, mask=n_ok, other=0.0).to(tl.float32)
    y = y.to(dtype)
    if SWIGLU:  # rows are gate, up, gate, up, ...: write silu(gate) * up
        gate, up = tl.split(tl.reshape(y, [BLOCK_N // 2, 2]))
        gate = gate.to(tl.float32)
        act = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
        act = (act * up.to(tl.float32)).to(dtype)
        m = (pid // M) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        m_ok = (m < N // 2) & last
        tl.store(Y + row * stride_ym + m, act, mask=m_ok)
    else:
        if HAS_RES:
            res = tl.load(Res + row * stride_rm + n, mask=ok, other=0.0)
            y = (res.to(tl.float32) + y.to(tl.float32)).to(dtype)
        tl.store(Y + row * stride_ym + n, y, mask=ok)


SETTINGS = ([(64, split, 3, 4) for split in (4, 8, 16)]
            + [(128, split, depth, 4) for split in (2, 4, 8, 16) for depth in (2, 3)]
            + [(256, split, depth, 4) for split in (1, 2, 4) for depth in (1, 2)])
"""(BLOCK_N, SPLIT, DEPTH, warps) the autotuner may try (`_prune` keeps a few per shape). Llama
projections have tens of groups and thousands to a hundred thousand outputs, so the narrow ones
need splits of K to give every SM work, and a program's groups are a chain of memory round trips
unless several are in flight (DEPTH). Left out because they lost on an H100: 3-way splits, 8 warps
for 256-wide blocks, requesting the residual and the row for 1/rms before the first group, and an
L2 prefetch of each program's remaining weights before its wait (the prefetches of the kernels
ahead delayed the ones due now)."""
MAX_SPLIT = max(setting[1] for setting in SETTINGS)
INTERPRETED_SETTING = (32, 1, 2)
"""(BLOCK_N, SPLIT, DEPTH) under Triton's interpreter (4 warps; no GPU to tune on); tests pass others."""
_KERNELS: dict[bool, object] = {}
Key = tuple[int, int, int, int, int, bool, bool]
"""(N, K, GROUP, M, PROLOGUE, SWIGLU, HAS_RES): what the autotuner keys its choice on."""
PINNED: dict[Key, tuple[int, int, int, int]] = {}
"""(BLOCK_N, SPLIT, DEPTH, warps) per key that skip the autotuner (its choices are kept on disk, so
a machine's later processes reuse its first's; `tuned_settings` shows them), for launching what
another process chose."""
MEASURED: dict[str, dict[Key, tuple[int, int, int, int]]] = {
    # Llama-3.2-3B's one-row projections (group 128): lm_head (plain and folded norm), w_gate_up (folded
    # norm, SwiGLU), wo and w_down (+ residual), wqkv (folded norm). The choices of the fastest of three
    # cold autotuning processes (the int4_pinned results README).
    "NVIDIA H200": {(128256, 3072, 128, 1, 0, False, False): (256, 1, 1, 4),
                    (128256, 3072, 128, 1, 3, False, False): (256, 1, 1, 4),
                    (16384, 3072, 128, 1, 3, True, False): (128, 4, 2, 4),
                    (3072, 3072, 128, 1, 0, False, True): (128, 16, 2, 4),
                    (3072, 8192, 128, 1, 0, False, True): (64, 16, 3, 4),
                    (5120, 3072, 128, 1, 3, False, False): (128, 16, 2, 4)},
}
"""Per GPU (torch.cuda.get_device_name), settings that skip the autotuner for the shapes measured end
to end: as for kiln.kernels.triton_matvec.MEASURED, the tuner's per-process picks changed the whole
step by several percent, and a cold process compiles every candidate it times. PINNED takes
precedence; other GPUs and shapes are tuned."""


_LAUNCHED: dict[Key, tuple[int, int, int, int]] = {}
"""The PINNED or MEASURED settings this process launched, per key."""


def tuned_settings() -> dict[str, list[int]]:
    """The settings launched so far in this process: what the autotuner chose (or read from its disk
    cache) and the PINNED or MEASURED ones: 'N,K,GROUP,M,PROLOGUE,SWIGLU,HAS_RES' -> [BLOCK_N, SPLIT,
    DEPTH, warps]."""
    return settings_launched(_KERNELS.get(False), 7, ("BLOCK_N", "SPLIT", "DEPTH", "num_warps"), _LAUNCHED)


def _per_split(args) -> int:
    return -(-(args["K"] // args["GROUP"]) // args["SPLIT"])


def _prune(configs, named_args, **kwargs):
    """Settings with at least one group per split, no more groups in flight than a split has, blocks
    no wider than the outputs, at least two programs per SM, and splits only where the blocks alone
    leave SMs without two programs (not for the lm_head's thousand blocks); of these, those with
    at least three programs per SM where any has. In the model each program's first groups arrive
    while the previous kernel runs (programmatic dependent launch), so what is left after its wait
    is a chain per program, shorter with more programs. 256-wide blocks (2-4x the
    registers of 128-wide ones) only where there are enough of them to fill the GPU without splits
    (the lm_head). The autotuner times a kernel alone, where a few long programs per SM can win; in
    the model, between other kernels, more and shorter programs were faster on every projection."""
    args = {**named_args, **kwargs}
    groups = args["K"] // args["GROUP"]
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count

    def programs(c) -> int:
        return args["M"] * -(-args["N"] // c.kwargs["BLOCK_N"]) * c.kwargs["SPLIT"]

    def valid(c) -> bool:
        split, depth, block_n = c.kwargs["SPLIT"], c.kwargs["DEPTH"], c.kwargs["BLOCK_N"]
        return split <= groups and depth <= -(-groups // split) and block_n <= max(64, args["N"])

    def fits(c) -> bool:
        blocks = -(-args["N"] // c.kwargs["BLOCK_N"])  # weight tiles; the rows of x share them
        wide_ok = c.kwargs["BLOCK_N"] < 256 or blocks >= sms
        return wide_ok and programs(c) >= 2 * sms and (c.kwargs["SPLIT"] == 1 or blocks < 2 * sms)

    kept = [c for c in configs if valid(c) and fits(c)]
    floor = min(3 * sms, max(map(programs, kept), default=0))
    return [c for c in kept if programs(c) >= floor] or [c for c in configs if valid(c)] or configs[:1]


def _cached() -> dict:
    """`cache_results=True` where this Triton has it (3.3+): the settings chosen for a shape are kept
    in Triton's cache directory, so later processes skip the autotuning part of their warm-up."""
    return {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}


def _kernel():
    interpret = interpreting()
    if interpret not in _KERNELS:
        jitted = triton.heuristics({
            "PER_SPLIT": _per_split,
            "EVEN": lambda a: a["N"] % a["BLOCK_N"] == 0 and _per_split(a) * a["SPLIT"] == a["K"] // a["GROUP"],
            "K_CHUNK": lambda a: min(1024, triton.next_power_of_2(a["K"])),
        })(triton.jit(_int4_matvec))
        _KERNELS[interpret] = jitted if interpret else triton.autotune(
            configs=[triton.Config({"BLOCK_N": bn, "SPLIT": s, "DEPTH": d}, num_warps=w, num_stages=1)
                     for bn, s, d, w in SETTINGS],
            key=["N", "K", "GROUP", "M", "PROLOGUE", "SWIGLU", "HAS_RES"],
            prune_configs_by={"early_config_prune": _prune}, **_cached())(jitted)
    return _KERNELS[interpret]


def launch(x: Tensor, packed: Tensor, scale: Tensor, offset: Tensor, group_size: int, bias: Tensor | None,
           norm_weight: Tensor | None, eps: float, prologue: str, swiglu: bool, residual: Tensor | None,
           setting: list[int] | None) -> Tensor:
    x = x.contiguous()
    M = x.shape[0]
    KW, N = packed.shape
    K = 8 * KW
    if swiglu and residual is not None:
        raise ValueError("int4_matvec: the swiglu epilogue takes no residual")
    y = torch.empty(M, N // 2 if swiglu else N, dtype=x.dtype, device=x.device)
    part = torch.empty(MAX_SPLIT * M * N, dtype=torch.float32, device=x.device)
    res = residual.contiguous() if residual is not None else None
    args = (x, packed, scale, offset, y, norm_weight, bias, res, part, arrival_counters(x.device, M * N), M, N, eps,
            x.stride(0), y.stride(0), res.stride(0) if res is not None else 0)
    pdl = pdl_enabled(x.device)
    flags = {"K": K, "GROUP": group_size, "PROLOGUE": PROLOGUES[prologue], "SWIGLU": swiglu,
             "HAS_BIAS": bias is not None, "HAS_RES": res is not None, "PDL": pdl}
    if pdl:
        flags["launch_pdl"] = True
    fixed = None if setting is not None else fixed_setting(
        PINNED, MEASURED, x.device, (N, K, group_size, M, PROLOGUES[prologue], swiglu, res is not None), _LAUNCHED)
    if fixed is not None:
        setting = list(fixed)
    if setting is not None or interpreting():
        given = list(setting or INTERPRETED_SETTING)
        bn, split, depth, warps = given + [2, 4][len(given) - 2:]  # DEPTH 2 and 4 warps unless given
        kernel = _kernel()
        kernel = getattr(kernel, "fn", kernel) if hasattr(kernel, "configs") else kernel  # past the autotuner
        kernel[(M * triton.cdiv(N, bn), split)](*args, BLOCK_N=bn, SPLIT=split, DEPTH=depth, num_warps=warps,
                                                num_stages=1, **flags)
    else:
        _kernel()[lambda meta: (M * triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT"])](*args, **flags)
    return y


@torch.library.custom_op("kiln::int4_matvec", mutates_args=())
def int4_matvec(x: Tensor, packed: Tensor, scale: Tensor, offset: Tensor, group_size: int, bias: Tensor | None = None,
                norm_weight: Tensor | None = None, eps: float = 0.0, prologue: str = "none", swiglu: bool = False,
                residual: Tensor | None = None, setting: list[int] | None = None) -> Tensor:
    """x [M, K] (M <= MAX_ROWS; [M, 2K] with the `silu_mul` prologue) times the int4 weight
    (`Int4TritonLinear`'s buffers) -> [M, N] in x's dtype ([M, N/2] with `swiglu`). `prologue`:
    none, rmsnorm (`norm_weight`, `eps`), silu_mul, or rms (a folded norm: `eps` only); `bias`
    and `residual` [M, N] are added after. `setting` (BLOCK_N, SPLIT[, DEPTH[, warps]]) skips the
    autotuner."""
    return launch(x, packed, scale, offset, group_size, bias, norm_weight, eps, prologue, swiglu, residual, setting)


@int4_matvec.register_fake
def _(x, packed, scale, offset, group_size, bias=None, norm_weight=None, eps=0.0, prologue="none", swiglu=False,
      residual=None, setting=None):
    return x.new_empty(x.shape[0], packed.shape[1] // 2 if swiglu else packed.shape[1])
