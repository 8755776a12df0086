# ruff: noqa: B023  (a probe kept as it ran; lambdas are used within their loop iteration)
"""Probe: the int4 row kernel's per-group product as eight K=16 dots (kiln's SWAP loop today) or as
one K=128 dot (the eight nibble tiles concatenated in registers, the x tile gathered in the same
order), same everything else. Correctness against the dequantized product; on a GPU, µs per call."""
import statistics
import sys

import torch
import triton
import triton.language as tl

from kiln.kernels.triton_rows import _nibble_pair
from kiln.llm.int4_layout import Int4TritonLinear


@triton.jit
def _cat2(a, b):
    t = tl.permute(tl.join(a, b), (0, 2, 1))
    return tl.reshape(t, (a.shape[0], 2 * a.shape[1]))


@triton.jit
def _probe(X, Q, Scale, Offset, Y, M, stride_xm, N: tl.constexpr, K: tl.constexpr, GROUP: tl.constexpr,
           BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, PER_SPLIT: tl.constexpr, SPLIT: tl.constexpr,
           MODE: tl.constexpr, ASM: tl.constexpr, STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    R: tl.constexpr = GROUP // 8
    dtype = X.dtype.element_ty
    MAGIC: tl.constexpr = 1024.0 if dtype == tl.float16 else 128.0
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    r = tl.arange(0, R)
    c = tl.arange(0, 8 * R)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for i in tl.range(0, PER_SPLIT, num_stages=STAGES):
        g = pid_k * PER_SPLIT + i
        words = tl.load(Q + (g * R + r)[None, :] * N + n[:, None])  # [BN, R]
        scale = tl.load(Scale + g * N + n).to(tl.float32)
        offset = tl.load(Offset + g * N + n).to(tl.float32)
        n0, n1 = _nibble_pair(words, 0, dtype, ASM)
        n2, n3 = _nibble_pair(words, 1, dtype, ASM)
        n4, n5 = _nibble_pair(words, 2, dtype, ASM)
        n6, n7 = _nibble_pair(words, 3, dtype, ASM)
        if MODE == 1:
            a = _cat2(_cat2(_cat2(n0, n1), _cat2(n2, n3)), _cat2(_cat2(n4, n5), _cat2(n6, n7)))  # col j*R + r
            xg = tl.load(X + m[None, :] * stride_xm + (g * GROUP + 8 * (c % R) + c // R)[:, None], mask=m_ok[None, :],
                         other=0.0)  # [8R, BM]: input 8r + j at row j*R + r
            part = tl.dot(a, xg)
            xsum = tl.sum(xg.to(tl.float32), 0)
        else:
            base = X + m[None, :] * stride_xm + (g * GROUP + 8 * r)[:, None]  # [R, BM]
            xs = tl.load(X + m[:, None] * stride_xm + (g * GROUP + c)[None, :], mask=m_ok[:, None], other=0.0)
            xsum = tl.sum(xs.to(tl.float32), 1)
            part = tl.dot(n0, tl.load(base + 0, mask=m_ok[None, :], other=0.0))
            part = tl.dot(n1, tl.load(base + 1, mask=m_ok[None, :], other=0.0), part)
            part = tl.dot(n2, tl.load(base + 2, mask=m_ok[None, :], other=0.0), part)
            part = tl.dot(n3, tl.load(base + 3, mask=m_ok[None, :], other=0.0), part)
            part = tl.dot(n4, tl.load(base + 4, mask=m_ok[None, :], other=0.0), part)
            part = tl.dot(n5, tl.load(base + 5, mask=m_ok[None, :], other=0.0), part)
            part = tl.dot(n6, tl.load(base + 6, mask=m_ok[None, :], other=0.0), part)
            part = tl.dot(n7, tl.load(base + 7, mask=m_ok[None, :], other=0.0), part)
        acc += part * scale[:, None] + xsum[None, :] * (offset - MAGIC * scale)[:, None]
    at = Y + m[None, :] * N + n[:, None]
    if SPLIT == 1:
        tl.store(at, acc, mask=m_ok[None, :])
    else:
        tl.atomic_add(at, acc, mask=m_ok[None, :])


def probe(x, layer, mode, bn=128, split=4, warps=4, stages=3, y=None):
    M, K = x.shape
    N = layer.out_features
    G = layer.group_size
    per = (K // G) // split
    if y is None:
        y = torch.zeros(M, N, dtype=torch.float32, device=x.device)
    elif split > 1:
        y.zero_()
    bm = max(16, triton.next_power_of_2(M))
    _probe[(N // bn, split)](x, layer.weight, layer.scale, layer.offset, y, M, x.stride(0), N=N, K=K, GROUP=G,
                             BLOCK_N=bn, BLOCK_M=bm, PER_SPLIT=per, SPLIT=split, MODE=mode,
                             ASM=x.is_cuda and x.dtype == torch.bfloat16, STAGES=stages, num_warps=warps)
    return y


def check(device, dtype, M, N, K):
    torch.manual_seed(0)
    lin = torch.nn.Linear(K, N, bias=False).to(device=device, dtype=dtype)
    layer = Int4TritonLinear.from_linear(lin, 128).to(device)
    x = torch.randn(M, K, device=device, dtype=dtype)
    ref = x.float() @ layer.dequantize(torch.float32).t()
    errs = {}
    for mode in (0, 1):
        y = probe(x, layer, mode, bn=min(128, N), split=2 if K >= 256 else 1)
        errs[mode] = ((y - ref).norm() / ref.norm()).item()
    return errs


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print(check("cpu", torch.float16, 5, 64, 256))
        sys.exit(0)
    from kiln.timing import cuda_graph_of, replay_rounds
    print("check", check("cuda", torch.bfloat16, 16, 512, 1024), check("cuda", torch.bfloat16, 32, 512, 1024))
    shapes = {"wqkv": (3072, 5120), "wo": (3072, 3072), "gate_up": (3072, 16384), "down": (8192, 3072)}
    rows_list = [int(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else [16, 32]
    for rows in rows_list:
        for name, (K, N) in shapes.items():
            torch.manual_seed(0)
            copies = max(2, int(256e6 // (K * N // 2)))
            layers = [Int4TritonLinear.from_linear(torch.nn.Linear(K, N, bias=False, device="cuda",
                                                                   dtype=torch.bfloat16), 128) for _ in range(copies)]
            x = torch.randn(rows, K, device="cuda", dtype=torch.bfloat16)
            y = torch.zeros(rows, N, device="cuda", dtype=torch.float32)
            variants = {"kiln": lambda L: L(x)}
            sms = 132
            for mode in (0, 1):
                for bn, split, warps, stages in ((128, 4, 4, 3), (128, 2, 4, 3), (64, 4, 4, 3), (128, 4, 8, 3),
                                                 (128, 4, 4, 2), (256, 2, 8, 3)):
                    if N % bn or (K // 128) % split:
                        continue
                    variants[f"m{mode} {bn}/{split}/{warps}/{stages}"] = (
                        lambda L, mode=mode, bn=bn, split=split, warps=warps, stages=stages:
                        probe(x, L, mode, bn, split, warps, stages, y))
            ref = x.float() @ layers[0].dequantize(torch.float32).t()
            graphs, keep = {}, []
            for key, fn in list(variants.items()):
                try:
                    out = fn(layers[0]).float()
                    err = ((out - ref).norm() / ref.norm()).item()
                    it = iter(range(10**9))
                    graphs[key] = cuda_graph_of(lambda fn=fn, it=it: fn(layers[next(it) % copies]), 2 * copies)
                    keep.append(err)
                    variants[key] = err
                except Exception as exc:  # a variant Triton cannot compile: say so, go on
                    print(f"  {name} rows {rows} {key}: failed {type(exc).__name__}: {str(exc)[:300]}")
            times = replay_rounds(graphs, 15)
            zero = cuda_graph_of(lambda: y.zero_(), 2 * copies)
            zt = statistics.median(replay_rounds({"z": zero}, 10)["z"][3:]) * 1000 / (2 * copies)
            print(f"{name} rows {rows} (K {K}, N {N}, {copies} copies; zeroing y {zt:.2f} us per call, included "
                  "in split>1 variants)")
            for key, t in times.items():
                us = statistics.median(t[3:]) * 1000 / (2 * copies)
                gbs = (K * N // 2 + 2 * 2 * (K // 128) * N) / us / 1e3
                print(f"  {key:22s} {us:8.2f} us  {gbs:7.1f} GB/s  err {variants[key]:.2e}")
