"""GPU probe: kiln's `_dequant` launched eagerly vs the same kernel inside an inductor graph (Triton op),
and a variant with N a constexpr and no masks when N % BLOCK_N == 0 ('even'), under both launchers;
plus inductor's own torch-op dequant. Each as a CUDA graph of 20 calls, interleaved, on the 3B shapes.
Prints the compiled kernels' metadata of the eager launches (num_stages etc.).
As run (tree of 3827a11, whose `_dequant` had N a runtime argument), with only the ruff line below added."""
# ruff: noqa: B023 (each shape's closures are called and captured within their own loop iteration)
import statistics

import torch
import triton
import triton.language as tl
from torch import nn
from torch.library import triton_op, wrap_triton

import kiln.llm.int4_layout as il
from kiln.kernels.triton_int4_dequant import _dequant, int4_dequantize_t
from kiln.timing import cuda_graph_of, replay_rounds


@triton.jit
def _dequant_even(Q, Scale, Offset, W, N: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                  EVEN: tl.constexpr):
    g = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    R: tl.constexpr = GROUP // 8
    r = tl.arange(0, R)
    if EVEN:
        words = tl.load(Q + (g * R + r)[:, None] * N + n[None, :])
        scale = tl.load(Scale + g * N + n).to(tl.float32)
        offset = tl.load(Offset + g * N + n).to(tl.float32)
    else:
        words = tl.load(Q + (g * R + r)[:, None] * N + n[None, :], mask=n_ok[None, :], other=0)
        scale = tl.load(Scale + g * N + n, mask=n_ok, other=0.0).to(tl.float32)
        offset = tl.load(Offset + g * N + n, mask=n_ok, other=0.0).to(tl.float32)
    q = (words[:, None, :] >> (4 * tl.arange(0, 8))[None, :, None]) & 15
    q = tl.reshape(q, [GROUP, BLOCK_N]).to(tl.float32)
    w = (q * scale[None, :] + offset[None, :]).to(W.dtype.element_ty)
    k = g * GROUP + tl.arange(0, GROUP)
    if EVEN:
        tl.store(W + k[:, None] * N + n[None, :], w)
    else:
        tl.store(W + k[:, None] * N + n[None, :], w, mask=n_ok[None, :])


def even_t(packed, scale, offset, group_size, dtype, kernel=_dequant_even, block_n=128, warps=4):
    KW, N = packed.shape
    w = torch.empty(8 * KW, N, dtype=dtype, device=packed.device)
    return w, kernel[(8 * KW // group_size, triton.cdiv(N, block_n))](
        packed, scale, offset, w, N, GROUP=group_size, BLOCK_N=block_n, EVEN=N % block_n == 0, num_warps=warps)


@triton_op("probe::dequant_even", mutates_args=())
def dequant_even_op(packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group_size: int,
                    dtype: torch.dtype) -> torch.Tensor:
    return even_t(packed, scale, offset, group_size, dtype, kernel=wrap_triton(_dequant_even))[0]


@dequant_even_op.register_fake
def _(packed, scale, offset, group_size, dtype):
    return packed.new_empty(8 * packed.shape[0], packed.shape[1], dtype=dtype)


def meta(compiled) -> str:
    m = compiled.metadata
    return f"stages={m.num_stages} warps={m.num_warps} shared={m.shared}"


SHAPES = {"wqkv": (3072, 5120), "wo": (3072, 3072), "w_gate_up": (3072, 16384), "w_down": (8192, 3072)}
torch.manual_seed(0)
for name, (k, n) in SHAPES.items():
    layer = il.Int4TritonLinear.from_linear(nn.Linear(k, n, bias=False).cuda().bfloat16(), 128)
    args = (layer.weight, layer.scale, layer.offset, 128, torch.bfloat16)
    ref = int4_dequantize_t(*args)
    w = torch.empty_like(ref)
    c0 = _dequant[(k // 128, triton.cdiv(n, 128))](layer.weight, layer.scale, layer.offset, w, n, GROUP=128,
                                                   BLOCK_N=128, num_warps=4)
    print(f"{name} eager _dequant: {meta(c0)}", flush=True)
    fns = {"eager kernel": lambda: int4_dequantize_t(*args),
           "triton op in inductor": torch.compile(dynamic=False)(lambda: torch.ops.kiln.int4_dequantize_t(*args)),
           "even eager": lambda: even_t(*args)[0],
           "even op in inductor": torch.compile(dynamic=False)(lambda: torch.ops.probe.dequant_even(*args)),
           "even eager 8 warps": lambda: even_t(*args, warps=8)[0],
           "even eager BN64": lambda: even_t(*args, block_n=64)[0],
           "inductor torch ops": torch.compile(dynamic=False)(lambda: il.dequantize_t(*args))}
    print(f"{name} even eager: {meta(even_t(*args)[1])}", flush=True)
    for label, fn in fns.items():
        assert torch.equal(fn(), ref) or label == "inductor torch ops", label
    graphs = {label: cuda_graph_of(fn, 20) for label, fn in fns.items()}
    times = replay_rounds(graphs, 30)
    bytes_ = k * n * 2 + k * n // 2 + 2 * (k // 128) * n * 2
    for label, ms in times.items():
        us = statistics.median(ms) / 20 * 1e3
        spread = (statistics.quantiles(ms, n=10)[-1] - statistics.quantiles(ms, n=10)[0]) / statistics.median(ms)
        print(f"{name:10s} {label:24s} {us:8.2f} us/call  {bytes_ / us / 1e6:7.1f} GB/s  p10-p90 {spread:.1%}",
              flush=True)
print("probe ok")
