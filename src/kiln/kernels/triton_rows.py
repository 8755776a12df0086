"""kiln's int4 decode projections for several rows at once (a decode step at batch > 1), written
in Triton, with the same fused parts as the one-row int4 kernel (kiln.kernels.triton_int4): an RMSNorm
(or a folded norm's 1/rms) or a SwiGLU before, the SwiGLU of interleaved gate/up rows after, a bias
and a residual add after.

A program owns a block of BLOCK_N outputs (and a split of K) for *all* rows: it reads each weight
tile once and multiplies it with every row's inputs on the tensor cores (`tl.dot`, rows padded to
BLOCK_M >= 16). The one-row kernel gives each row its own programs, which at batch B read and
unpack every weight tile B times, so a step's cost grew with the batch. int4 words (word [r, n]
holds inputs 8r..8r+7 of output n) are unpacked to a [GROUP, BLOCK_N] tile of q (exact in the model
dtype), one product with the inputs per group, and a group's scale and offset are applied once per
output: scale * sum q x + offset * sum x.

Dense (bf16/fp16) weights at batch > 1 take the model's own matmul (cuBLAS) instead: a Triton
kernel of this design was slower than cuBLAS on most of the 3B shape's projections (the
decode_batch results README).

Splits of K are added in a fixed order by the last program of a block to arrive
(kiln.kernels.triton_matvec._split_sum), so results do not depend on arrival order. With programmatic
dependent launch (Hopper) a program waits for the previous kernel before reading anything, then
lets the next kernel be scheduled. Launch settings are autotuned per shape and row bucket
(BLOCK_M) on the first call; the chosen settings are cached across processes where Triton can.
Tests run the kernel on CPU through Triton's interpreter.
"""

from __future__ import annotations

import inspect

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kiln.kernels.triton_int4 import PROLOGUES
from kiln.kernels.triton_launch import arrival_counters, interpreting, pdl_enabled
from kiln.kernels.triton_matvec import _split_sum, _x_tile

MAX_ROWS = 64
"""Rows (batch x tokens) up to which the row kernel runs; longer inputs (prefill) use the layer's
dequantized matmul."""
MAX_SPLIT = 4


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
def _rows_x(X, NormW, m, m_ok, k, stride_xm, rstd, K: tl.constexpr, PROLOGUE: tl.constexpr):
    """The [BLOCK_M, len(k)] input tile in the model dtype, the prologue applied as eager rounds it."""
    at = X + m[:, None] * stride_xm + k[None, :]
    x = _x_tile(at, NormW, k[None, :], m_ok[:, None] & (k < K)[None, :], rstd[:, None], K, PROLOGUE)
    return x.to(X.dtype.element_ty)


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
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, PER_SPLIT: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    R: tl.constexpr = GROUP // 8  # word rows per group
    RP: tl.constexpr = max(2, R)  # 8 RP >= 16: the tensor cores' smallest K
    GROUPS: tl.constexpr = K // GROUP
    dtype = X.dtype.element_ty
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    r = tl.arange(0, RP)
    r_ok = r < R
    shifts = 4 * tl.arange(0, 8)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if PROLOGUE == 1 or PROLOGUE == 3:
        rstd = _rows_rstd(X, m, m_ok, stride_xm, eps, K, BLOCK_M, 128)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    g0 = pid_k * PER_SPLIT
    for i in tl.range(0, PER_SPLIT):
        g = g0 + i
        g_ok = g < GROUPS
        words = tl.load(Q + (g * R + r)[:, None] * N + n[None, :], mask=g_ok & r_ok[:, None] & n_ok[None, :], other=0)
        # Per group: y = scale * sum_k q_k x_k + offset * sum_k x_k: the words unpacked to a [GROUP,
        # BLOCK_N] tile of q (word row r, nibble j: input 8r + j), one product with the inputs, the
        # scale and offset applied once per group and output.
        q = (words[:, None, :] >> shifts[None, :, None]) & 15  # [RP, 8, BLOCK_N]: input 8r + j
        q = tl.reshape(q, [8 * RP, BLOCK_N]).to(dtype)  # exact in the model dtype
        k = g * GROUP + tl.arange(0, 8 * RP)
        x = _rows_x(X, NormW, m, m_ok & g_ok, tl.where(k < g * GROUP + GROUP, k, K), stride_xm, rstd, K,
                    PROLOGUE if PROLOGUE != 3 else 0)  # [BLOCK_M, 8 RP]; the padding reads as 0
        part = tl.dot(x, q)
        xsum = tl.sum(x.to(tl.float32), 1)
        scale = tl.load(Scale + g * N + n, mask=g_ok & n_ok, other=0.0).to(tl.float32)
        offset = tl.load(Offset + g * N + n, mask=g_ok & n_ok, other=0.0).to(tl.float32)
        acc += part * scale[None, :] + xsum[:, None] * offset[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    y, last = _split_sum(acc, Part, Arrived, pid, pid_k, m[:, None], n[None, :], ok, M, N, SPLIT)
    if PROLOGUE == 3:
        y = y * rstd[:, None]
    if SWIGLU:  # rows of the weight are gate, up, gate, up, ...: write silu(gate) * up
        if HAS_BIAS:
            y += tl.load(Bias + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        y = y.to(dtype)
        gate, up = tl.split(tl.reshape(y, [BLOCK_M, BLOCK_N // 2, 2]))
        gate = gate.to(tl.float32)
        act = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
        act = (act * up.to(tl.float32)).to(dtype)
        h = pid * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(Y + m[:, None] * stride_ym + h[None, :], act, mask=m_ok[:, None] & (h < N // 2)[None, :] & last)
    else:
        _rows_epilogue(y, Y, Bias, Res, m, n, n_ok, ok & last, stride_ym, stride_rm, HAS_BIAS, HAS_RES)


INT4_SETTINGS = [(bn, split, stages) for bn in (32, 64, 128) for split in (1, 2, 4) for stages in (2,)]
"""(BLOCK_N, SPLIT, stages) the autotuner may try for int4 weights."""
INTERPRETED_INT4 = (16, 1)
_KERNELS: dict[bool, object] = {}


def _sms() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _prune_int4(configs, named_args, **kwargs):
    args = {**named_args, **kwargs}
    groups = args["K"] // args["GROUP"]
    valid = [c for c in configs if c.kwargs["SPLIT"] <= groups and c.kwargs["BLOCK_N"] <= max(32, args["N"])]
    programs = {id(c): -(-args["N"] // c.kwargs["BLOCK_N"]) * c.kwargs["SPLIT"] for c in valid}
    floor = min(_sms(), max(programs.values(), default=0))
    return [c for c in valid if programs[id(c)] >= floor] or configs[:1]


def _cached() -> dict:
    """`cache_results=True` where this Triton has it: chosen settings kept in Triton's cache dir."""
    return {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}


def _int4_per_split(a) -> int:
    return -(-(a["K"] // a["GROUP"]) // a["SPLIT"])


def _kernel():
    interpret = interpreting()
    if interpret not in _KERNELS:
        jitted = triton.heuristics({"PER_SPLIT": _int4_per_split})(triton.jit(_int4_rows, do_not_specialize=["M"]))
        configs = [triton.Config({"BLOCK_N": bn, "SPLIT": s}, num_warps=4, num_stages=st) for bn, s, st in INT4_SETTINGS]
        _KERNELS[interpret] = jitted if interpret else triton.autotune(
            configs=configs, key=["N", "K", "GROUP", "BLOCK_M", "PROLOGUE", "SWIGLU", "HAS_RES"],
            prune_configs_by={"early_config_prune": _prune_int4}, **_cached())(jitted)
    return _KERNELS[interpret]


def _run(args: tuple, flags: dict, N: int, setting: dict | None) -> None:
    if flags["PDL"]:
        flags["launch_pdl"] = True
    kernel = _kernel()
    if setting is not None:
        kernel = getattr(kernel, "fn", kernel) if hasattr(kernel, "configs") else kernel  # past the autotuner
        kernel[(triton.cdiv(N, setting["BLOCK_N"]), setting["SPLIT"])](*args, **setting, **flags)
    else:
        kernel[lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT"])](*args, **flags)


def int4_rows(x: Tensor, packed: Tensor, scale: Tensor, offset: Tensor, group_size: int, bias: Tensor | None,
              norm_weight: Tensor | None, eps: float, prologue: int, swiglu: bool, residual: Tensor | None,
              setting: list[int] | None = None) -> Tensor:
    """kiln::int4_matvec's product for 1 < M <= MAX_ROWS rows (`prologue` as its codes).
    `setting` (BLOCK_N, SPLIT[, warps, stages]) skips the autotuner."""
    x = x.contiguous()
    M = x.shape[0]
    KW, N = packed.shape
    y = torch.empty(M, N // 2 if swiglu else N, dtype=x.dtype, device=x.device)
    part = torch.empty(MAX_SPLIT * M * N, dtype=torch.float32, device=x.device)
    res = residual.contiguous() if residual is not None else None
    args = (x, packed, scale, offset, y, norm_weight, bias, res, part, arrival_counters(x.device, N), M, N, eps,
            x.stride(0), y.stride(0), res.stride(0) if res is not None else 0)
    flags = {"K": 8 * KW, "GROUP": group_size, "PROLOGUE": prologue, "SWIGLU": swiglu, "HAS_BIAS": bias is not None,
             "HAS_RES": res is not None, "PDL": pdl_enabled(x.device), "BLOCK_M": block_m(M)}
    given = setting or (INTERPRETED_INT4 if interpreting() else None)
    if given is not None:
        bn, split, warps, stages = (*given, 4, 2)[:4]
        given = {"BLOCK_N": bn, "SPLIT": split, "num_warps": warps, "num_stages": stages}
    _run(args, flags, N, given)
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
