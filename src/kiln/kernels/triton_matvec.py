"""kiln's decode-step matrix-vector kernel (`--decode-matvec triton`, the default where it runs),
written in Triton, with the RMSNorm before a projection and the residual add after it fused in.

A batch-1 decode step is a chain of matrix-vector products y = W x (W [N, K] row-major, x one
token) with small elementwise work between them. Program (row of x, block of BLOCK_N outputs, K
split) reads a [BLOCK_N, BLOCK_K] tile of W per iteration (the next one is loaded before this one
is used) and accumulates its products with the matching slice of x elementwise in an fp32 tile
of the same shape and layout, reduced once at the end. The rows of x are programs of their own,
next to each other, so at batch > 1 a block's weight tiles are shared through L2. x is tiny and
re-read from L2 by every program; W is read once. Optional parts, fixed at compile time:

- prologue `rmsnorm`: x is the residual stream h and the kernel multiplies by
  norm_w * h / rms(h) (each program computes its row's rms first), as kiln's RMSNorm does: in
  fp32, back to the model dtype, times the norm weight, rounded again;
- prologue `silu_mul`: x = silu(g) * u, with g and u the two halves of the input (SwiGLU);
- epilogue: + bias, + a residual, each rounded to the model dtype as eager does.

With SPLIT > 1 the K range is split among SPLIT programs per output block (more programs and
more bytes in flight for the narrow projections): each writes its fp32 partial sums, and the last
to arrive (an atomic counter per row and output block, reset by it) adds them in a fixed order, so
the result does not depend on arrival order, and applies the epilogue, all in one launch.

On Hopper the kernel is launched with programmatic dependent launch (`PDL`): its programs may be
scheduled while the previous kernel's last ones finish; each reads its first weight tile (which no
kernel writes), then waits (`gdc_wait`) before reading anything an earlier kernel produced.

Why: inductor fuses the norm and the SwiGLU into its own matrix-vector reductions, but reads the
weights well below the copy bandwidth, and the residual adds and norms between projections cost
more launches per layer. The accumulator is a 2-D tile in the weight tile's own layout: a 3-D
[rows, BLOCK_N, BLOCK_K] one made Triton move every weight tile through shared memory. Launch
settings are autotuned per shape on the first call (the engine's warm-up, before its CUDA graph
is captured), except for the shapes `MEASURED` holds for the GPU. The measurements are in the
decode_matvec results README.

Tests run it on CPU through Triton's interpreter (TRITON_INTERPRET=1) with a fixed setting.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kiln.kernels.triton_launch import arrival_counters, fixed_setting, interpreting, pdl_enabled, settings_launched

MAX_ROWS = 8
"""Rows (batch x tokens) up to which the kernel runs; longer inputs (prefill) use `linear`."""


@triton.jit
def _x_tile(x_at, NormW, k, ok, rstd, K: tl.constexpr, PROLOGUE: tl.constexpr):
    """x at the input features k (x_at: their pointers, k's shape), in fp32, the prologue applied
    with eager's roundings: RMSNorm (`rstd`: the row's) or SwiGLU (x_at + K: the up half)."""
    dtype = x_at.dtype.element_ty
    x = tl.load(x_at, mask=ok, other=0.0).to(tl.float32)
    if PROLOGUE == 1:
        nw = tl.load(NormW + k, mask=k < K, other=0.0).to(tl.float32)
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


@triton.jit
def _split_sum(y, Part, Arrived, pid, pid_k, row, n, n_ok, M, N, SPLIT: tl.constexpr):
    """The whole product from the SPLIT programs' partial sums y [BLOCK_N] of one (row, block of
    outputs), and whether this program holds it (`last`; with one split, always). Each writes
    its fp32 partials; the last of them to arrive (an atomic counter per (row, block), reset by
    it) adds all of them in split order, so the result does not depend on arrival order. acq_rel:
    the other programs' partials are visible once their arrival is counted."""
    last = pid_k == 0
    if SPLIT > 1:
        part_at = Part + row * N + n
        tl.store(part_at + pid_k * M * N, y, mask=n_ok)
        tl.debug_barrier()  # one thread does the atomic: every warp's stores come before its release
        arrived = tl.atomic_add(Arrived + pid, 1, sem="acq_rel")
        last = arrived == SPLIT - 1
        y = tl.zeros(y.shape, dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            y += tl.load(part_at + s * M * N, mask=n_ok & last, other=0.0)
        if last:
            tl.atomic_xchg(Arrived + pid, 0)  # every split has arrived: reset for the next call
    return y, last


def _matvec(X, W, Y, NormW, Bias, Res, Part, Arrived, M, N, eps,
            stride_xm, stride_wn, stride_ym, stride_rm,
            K: tl.constexpr, PROLOGUE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PDL: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
            EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PER_SPLIT: tl.constexpr):
    # Program (row, block of outputs) along axis 0, rows fastest: the programs of one block's rows
    # run together and share its weight tiles through L2. Axis 1: the split of K.
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    row = pid % M
    n = (pid // M) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    kk = tl.arange(0, BLOCK_K)
    dtype = X.dtype.element_ty
    x_row = X + row * stride_xm
    k_lo = pid_k * PER_SPLIT
    TILES: tl.constexpr = PER_SPLIT // BLOCK_K
    if PDL:  # programmatic dependent launch: the next kernel may be scheduled as these programs end
        gdc_launch_dependents()
    # The first weight tile: no earlier kernel writes weights, so it is read before the wait.
    w_rows = W + n[:, None] * stride_wn
    w = _w_tile(w_rows, k_lo + kk, n_ok, K, EVEN_N and EVEN_K)
    if PDL:
        gdc_wait()  # everything below may read what the previous kernel wrote (x, the residual, counters)
    rstd = 0.0
    if PROLOGUE == 1:  # the row's 1 / rms over all K (the norm needs the whole row, every split too)
        squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            h = tl.load(x_row + k0 + kk, mask=(k0 + kk) < K, other=0.0).to(tl.float32)
            squares += h * h
        rstd = tl.rsqrt(tl.sum(squares, 0) / K + eps)
    # Each iteration loads the next tile before using this one; the tiles' products are added up
    # elementwise in the tile's own layout and reduced once at the end.
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for i in range(0, TILES):  # a static trip count; k >= K loads nothing
        k = k_lo + i * BLOCK_K + kk
        nxt = i + 1 - (i + 1) // TILES  # the last iteration reloads its own tile (an L2 hit)
        w_next = _w_tile(w_rows, k_lo + nxt * BLOCK_K + kk, n_ok, K, EVEN_N and EVEN_K)
        x = _x_tile(x_row + k, NormW, k, k < K, rstd, K, PROLOGUE)
        acc += w.to(tl.float32) * x[None, :]
        w = w_next
    y = tl.sum(acc, 1)  # [BLOCK_N]
    y, last = _split_sum(y, Part, Arrived, pid, pid_k, row, n, n_ok, M, N, SPLIT)
    ok = n_ok & last
    if HAS_BIAS:
        y += tl.load(Bias + n, mask=n_ok, other=0.0).to(tl.float32)
    y = y.to(dtype)
    if HAS_RES:
        res = tl.load(Res + row * stride_rm + n, mask=ok, other=0.0)
        y = (res.to(tl.float32) + y.to(tl.float32)).to(dtype)
    tl.store(Y + row * stride_ym + n, y, mask=ok)


DENSE_SETTINGS = [(bn, bk, split) for bn in (4, 8, 16) for bk in (256, 512) for split in (1, 2)]
"""(BLOCK_N, BLOCK_K, SPLIT) the autotuner tries for dense weights: the ones that led a wider
sweep on an H100, within the autotuner's own timing noise of each other (fewer choices is
steadier)."""


def _configs() -> list[triton.Config]:
    return [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT": split}, num_warps=4, num_stages=2)
            for bn, bk, split in DENSE_SETTINGS]


def _prune(configs, named_args, **kwargs):
    """Settings whose splits leave every program at least one tile."""
    args = {**named_args, **kwargs}
    kept = [c for c in configs if args["K"] >= c.kwargs["SPLIT"] * c.kwargs["BLOCK_K"]]
    return kept or [triton.Config({"BLOCK_N": 4, "BLOCK_K": 128, "SPLIT": 1}, num_warps=4, num_stages=2)]


def _per_split(args) -> int:
    """Columns of W per split, a whole number of BLOCK_K tiles."""
    tiles = -(-args["K"] // args["BLOCK_K"])
    return -(-tiles // args["SPLIT"]) * args["BLOCK_K"]


Key = tuple[int, int, int, int, bool]
"""(N, K, M, PROLOGUE, HAS_RES): what the autotuner keys its choice on (with the tensors' dtypes)."""
PINNED: dict[Key, tuple[int, int, int]] = {}
"""(BLOCK_N, BLOCK_K, SPLIT) per key that skip the autotuner: a process then launches what another
chose (`tuned_settings`), instead of timing the candidates again with its own noise."""
MEASURED: dict[str, dict[Key, tuple[int, int, int]]] = {
    # Llama-3.2-3B's one-row projections: wqkv, w_gate_up and lm_head (folded RMSNorm), wo (+ residual),
    # w_down (SwiGLU prologue, + residual). The choices of the fastest of three autotuning processes,
    # reproduced with them pinned (the matvec_pinned results README).
    "NVIDIA H200": {(5120, 3072, 1, 1, False): (4, 256, 1), (3072, 3072, 1, 0, True): (4, 512, 1),
                    (16384, 3072, 1, 1, False): (4, 512, 1), (3072, 8192, 1, 2, True): (16, 512, 2),
                    (128256, 3072, 1, 1, False): (4, 256, 1)},
}
"""Per GPU (torch.cuda.get_device_name), settings that skip the autotuner for the shapes measured
end to end: the autotuner's candidates time within noise of each other one kernel at a time, yet
its per-process choices changed the whole decode step by several percent; other GPUs and shapes
are tuned as before. PINNED takes precedence."""


def measured_setting(device: torch.device, key: Key) -> tuple[int, int, int] | None:
    """The pinned or measured (BLOCK_N, BLOCK_K, SPLIT) for `key` on `device`, or None: autotune."""
    return fixed_setting(PINNED, MEASURED, device, key, _LAUNCHED)


_LAUNCHED: dict[Key, tuple[int, int, int]] = {}
"""The PINNED or MEASURED settings this process launched, per key."""


def tuned_settings() -> dict[str, list[int]]:
    """The settings launched so far in this process: what its autotuner chose and the PINNED or
    MEASURED ones: 'N,K,M,PROLOGUE,HAS_RES' -> [BLOCK_N, BLOCK_K, SPLIT] (benches record it:
    candidates within timing noise of each other can differ between processes)."""
    return settings_launched(_KERNELS.get(False), 5, ("BLOCK_N", "BLOCK_K", "SPLIT"), _LAUNCHED)


_KERNELS: dict[bool, object] = {}
INTERPRETED_SETTING = (16, 64, 1)
"""(BLOCK_N, BLOCK_K, SPLIT) under Triton's interpreter (no GPU to tune on); tests pass others."""


def _kernel():
    interpret = interpreting()
    if interpret not in _KERNELS:
        jitted = triton.heuristics({"EVEN_N": lambda a: a["N"] % a["BLOCK_N"] == 0,
                                    "EVEN_K": lambda a: a["K"] == _per_split(a) * a["SPLIT"],
                                    "PER_SPLIT": _per_split})(triton.jit(_matvec))
        _KERNELS[interpret] = jitted if interpret else triton.autotune(
            configs=_configs(), key=["N", "K", "M", "PROLOGUE", "HAS_RES"],
            prune_configs_by={"early_config_prune": _prune})(jitted)
    return _KERNELS[interpret]


MAX_SPLIT = 4


def launch(x: Tensor, weight: Tensor, bias: Tensor | None, norm_weight: Tensor | None, eps: float, silu_mul: bool,
           residual: Tensor | None, setting: list[int] | None) -> Tensor:
    x = x.contiguous()
    M = x.shape[0]
    N, K = weight.shape
    prologue = 1 if norm_weight is not None else 2 if silu_mul else 0
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    part = torch.empty(MAX_SPLIT * M * N, dtype=torch.float32, device=x.device)
    res = residual.contiguous() if residual is not None else None
    args = (x, weight, y, norm_weight, bias, res, part, arrival_counters(x.device, M * N), M, N, eps, x.stride(0),
            weight.stride(0), y.stride(0), res.stride(0) if res is not None else 0)
    pdl = pdl_enabled(x.device)
    flags = {"K": K, "PROLOGUE": prologue, "HAS_BIAS": bias is not None, "HAS_RES": res is not None, "PDL": pdl}
    if pdl:
        flags["launch_pdl"] = True
    pinned = None if setting is not None else measured_setting(x.device, (N, K, M, prologue, res is not None))
    if pinned is not None:
        setting = list(pinned)
    if setting is not None or interpreting():
        bn, bk, split, warps, stages = (*(setting or INTERPRETED_SETTING), 4, 2)[:5]
        kernel = _kernel()
        kernel = getattr(kernel, "fn", kernel) if hasattr(kernel, "configs") else kernel  # past the autotuner
        kernel[(M * triton.cdiv(N, bn), split)](*args, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split, num_warps=warps,
                                                num_stages=stages, **flags)
    else:
        _kernel()[lambda meta: (M * triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT"])](*args, **flags)
    return y


@torch.library.custom_op("kiln::matvec", mutates_args=())
def matvec(x: Tensor, weight: Tensor, bias: Tensor | None, norm_weight: Tensor | None, eps: float,
           silu_mul: bool, residual: Tensor | None, setting: list[int] | None = None) -> Tensor:
    """x [M, K] (M <= MAX_ROWS; [M, 2K] with `silu_mul`) times weight [N, K]^T -> [M, N] in x's
    dtype. `norm_weight`: RMSNorm x first (with `eps`); `silu_mul`: x = silu(first half) * second
    half; `bias` [N] and `residual` [M, N] are added after. `setting` (BLOCK_N, BLOCK_K, SPLIT,
    warps, stages) skips the autotuner (tests, benchmarks)."""
    return launch(x, weight, bias, norm_weight, eps, silu_mul, residual, setting)


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
