"""kiln's decode-step matrix-vector kernel (`--decode-matvec triton`), written in Triton, with the
RMSNorm before a projection and the residual add after it fused in.

A batch-1 decode step is a chain of matrix-vector products y = W x (W [N, K] row-major, x one
token) with small elementwise work between them. Program (block of BLOCK_N outputs, K split)
reads a [BLOCK_N, BLOCK_K] tile of W per iteration and accumulates its products with the matching
slice of x elementwise in an fp32 [rows, BLOCK_N, BLOCK_K] tile, reduced across lanes once at
the end. x is tiny and re-read from L2 by every program; W is read once. Optional parts, fixed at
compile time:

- prologue `rmsnorm`: x is the residual stream h and the kernel multiplies by
  norm_w * h / rms(h) (each program computes its row's rms first), as kiln's RMSNorm does: in
  fp32, back to the model dtype, times the norm weight, rounded again;
- prologue `silu_mul`: x = silu(g) * u, with g and u the two halves of the input (SwiGLU);
- epilogue: + bias, + a residual, each rounded to the model dtype as eager does.

With SPLIT > 1 the K range is split among SPLIT programs per output block (more programs and
more bytes in flight for the narrow projections): each writes its fp32 partial sums, and the last
to arrive (an atomic counter per output block, reset by it) adds them in a fixed order, so the
result does not depend on arrival order, and applies the epilogue, all in one launch.

On Hopper the kernel is launched with programmatic dependent launch (`PDL`): its programs may be
scheduled while the previous kernel's last ones finish; each reads its first weight tile (which no
kernel writes), then waits (`gdc_wait`) before reading anything an earlier kernel produced.

Why: inductor fuses the norm and the SwiGLU into its own matrix-vector reductions, but read the
weights at 2.0-2.7 TB/s in the 3B decode profile on an H100, and the residual adds and norms
between projections cost ~2 more launches per layer (284 kernels per step against 228 here).
Measured on an H100 (benchmarks/results/h100/llm/decode_matvec): per projection on par with
inductor; all layers' projections chained 7 % faster with PDL (2.23 against 2.41 ms); the whole
3B decode step 0.7 % faster (336.6 against 334.2 tok/s), since the attention between projections
keeps most kernel boundaries serial. Launch settings are autotuned per shape on the first call
(the engine's warm-up, before its CUDA graph is captured).

Tests run it on CPU through Triton's interpreter (TRITON_INTERPRET=1) with a fixed setting.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kiln.llm.triton_decode import arrival_counters

MAX_ROWS = 8
"""Rows (batch x tokens) up to which the kernel runs; longer inputs (prefill) use `linear`."""


@triton.jit
def _x_tile(x_at, NormW, k, ok, rstd, K: tl.constexpr, PROLOGUE: tl.constexpr):
    """x at the input features k (x_at: its pointers, rows first), in fp32, the prologue applied
    with eager's roundings: RMSNorm (`rstd` broadcast to x's shape) or SwiGLU (x_at + K: the up half)."""
    dtype = x_at.dtype.element_ty
    x = tl.load(x_at, mask=ok, other=0.0).to(tl.float32)
    if PROLOGUE == 1:
        nw = tl.expand_dims(tl.load(NormW + k, mask=k < K, other=0.0).to(tl.float32), 0)
        x = (x * rstd).to(dtype).to(tl.float32)
        x = (x * nw).to(dtype).to(tl.float32)
    if PROLOGUE == 2:
        u = tl.load(x_at + K, mask=ok, other=0.0).to(tl.float32)
        x = (x * tl.sigmoid(x)).to(dtype).to(tl.float32)
        x = (x * u).to(dtype).to(tl.float32)
    return x


@triton.jit
def _w_tile(w_rows, k, n_ok, K: tl.constexpr, EVEN: tl.constexpr):
    if EVEN:
        return tl.load(w_rows + k[None, :])
    return tl.load(w_rows + k[None, :], mask=n_ok[:, None] & (k < K)[None, :], other=0.0)


def _matvec(X, W, Scale, Offset, Y, NormW, Bias, Res, Part, Arrived, M, N, eps,
            stride_xm, stride_wn, stride_sn, stride_ym, stride_rm,
            K: tl.constexpr, KW: tl.constexpr, QUANT: tl.constexpr, GROUP: tl.constexpr,
            PROLOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PDL: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
            EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PER_SPLIT: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    mm = tl.arange(0, BLOCK_M)
    m_ok = mm < M
    kk = tl.arange(0, BLOCK_K)
    dtype = X.dtype.element_ty
    x_rows = X + mm[:, None] * stride_xm
    k_lo = pid_k * PER_SPLIT
    TILES: tl.constexpr = PER_SPLIT // BLOCK_K
    w_rows = W + n[:, None] * stride_wn
    if PDL:  # programmatic dependent launch: the next kernel may be scheduled as these programs end
        gdc_launch_dependents()
    if QUANT == 0:  # the first weight tile: no earlier kernel writes weights, so it is read before the wait
        w = _w_tile(w_rows, k_lo + kk, n_ok, K, EVEN_N and EVEN_K)
    if PDL:
        gdc_wait()  # everything below may read what the previous kernel wrote (x, the residual, counters)
    rstd = 0.0
    if PROLOGUE == 1:  # each row's 1 / rms over all K (the norm needs the whole row, every split too)
        squares = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            h = tl.load(x_rows + (k0 + kk)[None, :], mask=m_ok[:, None] & ((k0 + kk) < K)[None, :],
                        other=0.0).to(tl.float32)
            squares += h * h
        rstd = tl.rsqrt(tl.sum(squares, 1) / K + eps)
    if QUANT == 0:  # W [N, K] in the model dtype; each iteration loads the next tile before using this one
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
        for i in range(0, TILES):  # a static trip count; k >= K loads nothing
            k = k_lo + i * BLOCK_K + kk
            nxt = i + 1 - (i + 1) // TILES  # the last iteration reloads its own tile (an L2 hit)
            w_next = _w_tile(w_rows, k_lo + nxt * BLOCK_K + kk, n_ok, K, EVEN_N and EVEN_K)
            x = _x_tile(x_rows + k[None, :], NormW, k, m_ok[:, None] & (k < K)[None, :],
                        tl.expand_dims(rstd, 1) if PROLOGUE == 1 else rstd, K, PROLOGUE)
            acc += w.to(tl.float32)[None, :, :] * x[:, None, :]
            w = w_next
        y = tl.sum(acc, 2)  # [BLOCK_M, BLOCK_N]
    else:  # kiln's int4 layout: W uint8 [N, K/2], byte j holds input j (low nibble) and j + K/2
        # (high); per GROUP inputs one scale and offset, [N, K / GROUP]. A tile is [BLOCK_N, NG
        # groups, GROUP bytes], so each group's scale is one value per row, broadcast along it.
        NG: tl.constexpr = BLOCK_K // GROUP
        gg = tl.arange(0, NG)
        ee = tl.arange(0, GROUP)
        x_rows3 = X + mm[:, None, None] * stride_xm
        acc = tl.zeros([BLOCK_M, BLOCK_N, NG, GROUP], dtype=tl.float32)
        for i in range(0, TILES):
            j0 = k_lo + i * BLOCK_K
            j = j0 + gg[:, None] * GROUP + ee[None, :]  # [NG, GROUP] byte columns
            j_ok = j < KW
            g_ok = (j0 // GROUP + gg) < KW // GROUP
            b = tl.load(W + n[:, None, None] * stride_wn + j[None, :, :], mask=n_ok[:, None, None] & j_ok[None, :, :],
                        other=0)
            for half in tl.static_range(2):
                k = j + half * KW  # [NG, GROUP] input features
                x = _x_tile(x_rows3 + k[None, :, :], NormW, k, m_ok[:, None, None] & j_ok[None, :, :],
                            tl.expand_dims(tl.expand_dims(rstd, 1), 2) if PROLOGUE == 1 else rstd, K, PROLOGUE)
                grp = j0 // GROUP + gg + half * (KW // GROUP)
                s_at = n[:, None] * stride_sn + grp[None, :]
                s_ok = n_ok[:, None] & g_ok[None, :]
                scale = tl.load(Scale + s_at, mask=s_ok, other=0.0).to(tl.float32)
                offset = tl.load(Offset + s_at, mask=s_ok, other=0.0).to(tl.float32)
                q = ((b >> (4 * half)) & 15).to(tl.float32)
                w = q * scale[:, :, None] + offset[:, :, None]
                acc += w[None, :, :, :] * x[:, None, :, :]
        y = tl.sum(tl.sum(acc, 3), 2)
    ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT > 1:
        # Partial sums out; the last program of this output block to arrive adds them in split
        # order. acq_rel: the other programs' partials are visible once their arrival is counted.
        part_at = Part + mm[:, None] * N + n[None, :]
        tl.store(part_at + pid_k * M * N, y, mask=ok)
        arrived = tl.atomic_add(Arrived + pid_n, 1, sem="acq_rel")
        last = arrived == SPLIT - 1
        ok = ok & last
        y = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            y += tl.load(part_at + s * M * N, mask=ok, other=0.0)
        if last:
            tl.atomic_xchg(Arrived + pid_n, 0)  # every split has arrived: reset for the next call
    if HAS_BIAS:
        y += tl.load(Bias + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y = y.to(dtype)
    if HAS_RES:
        res = tl.load(Res + mm[:, None] * stride_rm + n[None, :], mask=ok, other=0.0)
        y = (res.to(tl.float32) + y.to(tl.float32)).to(dtype)
    tl.store(Y + mm[:, None] * stride_ym + n[None, :], y, mask=ok)


def _settings() -> list[tuple[int, int, int, int, int]]:
    """(BLOCK_N, BLOCK_K, SPLIT, warps, stages) tried by the autotuner. The first H100 sweep
    (2026-11-24, 48 settings per 3B projection: BLOCK_N 4-32, BLOCK_K 256/512, SPLIT 1-4, 4/8
    warps) put 512-wide tiles, 4 warps and at most 2 splits first on every shape, within ~10 % of
    each other; the autotuner's own timing noise is about that, so fewer choices is steadier."""
    return [(bn, bk, split, 4, 2) for bn in (4, 8, 16) for bk in (256, 512) for split in (1, 2)]


def _configs() -> list[triton.Config]:
    return [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT": split}, num_warps=w, num_stages=s)
            for bn, bk, split, w, s in _settings()]


def _prune(configs, named_args, **kwargs):
    """Drop settings whose fp32 tile would spill (more than 128 values per thread) and splits that
    would leave a program less than one tile of K."""
    args = {**named_args, **kwargs}
    kept = []
    for c in configs:
        bn, bk, split = c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.kwargs["SPLIT"]
        tile = args["BLOCK_M"] * bn * bk // (32 * c.num_warps)
        if tile <= 128 and args["KW"] >= split * bk and bk >= args["GROUP"]:
            kept.append(c)
    return kept or [triton.Config({"BLOCK_N": 4, "BLOCK_K": max(128, args["GROUP"]), "SPLIT": 1}, num_warps=4,
                                  num_stages=2)]


def _per_split(args) -> int:
    """Columns of W per split, a whole number of BLOCK_K tiles."""
    tiles = -(-args["KW"] // args["BLOCK_K"])
    return -(-tiles // args["SPLIT"]) * args["BLOCK_K"]


_KERNELS: dict[bool, object] = {}
INTERPRETED_SETTING = (16, 64, 1)
"""(BLOCK_N, BLOCK_K, SPLIT) under Triton's interpreter (no GPU to tune on); tests pass others."""


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _kernel():
    interpret = interpreting()
    if interpret not in _KERNELS:
        jitted = triton.heuristics({"EVEN_N": lambda a: a["N"] % a["BLOCK_N"] == 0,
                                    "EVEN_K": lambda a: a["KW"] == _per_split(a) * a["SPLIT"],
                                    "PER_SPLIT": _per_split})(triton.jit(_matvec))
        _KERNELS[interpret] = jitted if interpret else triton.autotune(
            configs=_configs(), key=["N", "K", "QUANT", "GROUP", "BLOCK_M", "PROLOGUE", "HAS_RES"],
            prune_configs_by={"early_config_prune": _prune})(jitted)
    return _KERNELS[interpret]


PDL = os.environ.get("KILN_PDL", "1") != "0"
"""Launch the dense kernel with programmatic dependent launch where the GPU has it (Hopper and
newer): each call's programs are scheduled while the previous kernel's last ones finish, and read
their first weight tile before waiting for it (`gdc_wait`). KILN_PDL=0 (or setting this False)
turns it off, for comparisons."""


def pdl_enabled(device: torch.device) -> bool:
    return PDL and device.type == "cuda" and not interpreting() and torch.cuda.get_device_capability(device)[0] >= 9


MAX_SPLIT = 4


def launch(x: Tensor, weight: Tensor, scale: Tensor | None, offset: Tensor | None, group_size: int,
           bias: Tensor | None, norm_weight: Tensor | None, eps: float, silu_mul: bool, residual: Tensor | None,
           setting: list[int] | None) -> Tensor:
    """Runs the kernel; `scale` given: `weight` is kiln's packed int4 layout (see `_matvec`)."""
    x = x.contiguous()
    M = x.shape[0]
    N, KW = weight.shape
    quant = scale is not None
    K = 2 * KW if quant else KW
    prologue = 1 if norm_weight is not None else 2 if silu_mul else 0
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    part = torch.empty(MAX_SPLIT * M * N, dtype=torch.float32, device=x.device)
    res = residual.contiguous() if residual is not None else None
    args = (x, weight, scale if quant else weight, offset if quant else weight, y, norm_weight, bias, res, part,
            arrival_counters(x.device, N), M, N, eps, x.stride(0), weight.stride(0), scale.stride(0) if quant else 0,
            y.stride(0), res.stride(0) if res is not None else 0)
    pdl = pdl_enabled(x.device) and not quant
    flags = {"K": K, "KW": KW, "QUANT": int(quant), "GROUP": group_size if quant else 1, "PROLOGUE": prologue,
             "HAS_BIAS": bias is not None, "HAS_RES": res is not None, "BLOCK_M": max(1, triton.next_power_of_2(M)),
             "PDL": pdl}
    if pdl:
        flags["launch_pdl"] = True
    if setting is not None or interpreting():
        bn, bk, split, warps, stages = (*(setting or INTERPRETED_SETTING), 4, 2)[:5]
        kernel = _kernel()
        kernel = getattr(kernel, "fn", kernel) if hasattr(kernel, "configs") else kernel  # past the autotuner
        kernel[(triton.cdiv(N, bn), split)](*args, BLOCK_N=bn, BLOCK_K=max(bk, flags["GROUP"]), SPLIT=split,
                                            num_warps=warps, num_stages=stages, **flags)
    else:
        _kernel()[lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT"])](*args, **flags)
    return y


@torch.library.custom_op("kiln::matvec", mutates_args=())
def matvec(x: Tensor, weight: Tensor, bias: Tensor | None, norm_weight: Tensor | None, eps: float,
           silu_mul: bool, residual: Tensor | None, setting: list[int] | None = None) -> Tensor:
    """x [M, K] (M <= MAX_ROWS; [M, 2K] with `silu_mul`) times weight [N, K]^T -> [M, N] in x's
    dtype. `norm_weight`: RMSNorm x first (with `eps`); `silu_mul`: x = silu(first half) * second
    half; `bias` [N] and `residual` [M, N] are added after. `setting` (BLOCK_N, BLOCK_K, SPLIT,
    warps, stages) skips the autotuner (tests, benchmarks)."""
    return launch(x, weight, None, None, 0, bias, norm_weight, eps, silu_mul, residual, setting)


@matvec.register_fake
def _(x, weight, bias, norm_weight, eps, silu_mul, residual, setting=None):
    return x.new_empty(x.shape[0], weight.shape[0])


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, norm: tuple[Tensor, float] | None = None,
           silu_mul: bool = False, residual: Tensor | None = None) -> Tensor:
    """`F.linear` on the last dim of x [..., K] through the kernel, with the fused parts above."""
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])
    res = residual.reshape(-1, weight.shape[0]) if residual is not None else None
    norm_weight, eps = norm if norm is not None else (None, 0.0)
    y = torch.ops.kiln.matvec(rows, weight, bias, norm_weight, eps, silu_mul, res)
    return y.view(*lead, weight.shape[0])
