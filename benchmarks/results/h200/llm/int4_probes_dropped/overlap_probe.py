# ruff: noqa: E702, B023, F841  (a probe kept as it ran; lambdas are used within their loop iteration)
"""Probe: can int4 prefill's dequantization overlap the bf16 matmuls on a side stream?

A 3B-shaped prefill (512 tokens, 28 layers, distinct weights per layer) as CUDA graphs:
  bf16     : the layers' matmuls, SDPA and SwiGLU with bf16 weights already there (bf16's prefill);
  serial   : each projection dequantized just before its matmul, one stream (int4 today);
  overlap  : layer i+1's weights dequantized on a side stream into the other of two slots while
             layer i computes on the main stream (events order slot reuse);
  overlap_p: the same, one projection ahead instead of one layer (four slots, one per projection kind);
  dequant  : the dequant kernels alone.
Interleaved rounds, median ms per prefill.
"""
import statistics
import sys

import torch
import torch.nn.functional as F
import triton

from kiln.kernels.triton_int4_dequant import BLOCK_N, _dequant

torch.manual_seed(0)
dev = "cuda"
L = int(sys.argv[1]) if len(sys.argv) > 1 else 28
M, H, FF, G = 512, 3072, 8192, 128
SHAPES = {"wqkv": (H, 5120), "wo": (H, H), "gu": (H, 2 * FF), "down": (FF, H)}  # (K, N): y = x @ W^T[K,N]
bf = torch.bfloat16


def int4(K, N):
    q = torch.randint(-2**31, 2**31 - 1, (K // 8, N), dtype=torch.int32, device=dev)
    s = (torch.rand(K // G, N, device=dev) * 0.01).to(bf)
    o = (torch.randn(K // G, N, device=dev) * 0.01).to(bf)
    return q, s, o


def deq(w, out):
    q, s, o = w
    K, N = out.shape
    _dequant[(K // G, triton.cdiv(N, BLOCK_N))](q, s, o, out, N, GROUP=G, BLOCK_N=BLOCK_N, EVEN=N % BLOCK_N == 0,
                                                 num_warps=4)


layers4 = [{k: int4(*v) for k, v in SHAPES.items()} for _ in range(L)]
layers16 = []
for lw in layers4:
    d = {}
    for k, (K, N) in SHAPES.items():
        d[k] = torch.empty(K, N, dtype=bf, device=dev)
        deq(lw[k], d[k])
    layers16.append(d)
torch.cuda.synchronize()
x0 = torch.randn(M, H, dtype=bf, device=dev)


def layer(x, w):
    qkv = x @ w["wqkv"]
    q, k, v = qkv.split([H, 1024, 1024], dim=1)
    q = q.view(1, M, 24, 128).transpose(1, 2)
    k = k.view(1, M, 8, 128).transpose(1, 2)
    v = v.view(1, M, 8, 128).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + a.transpose(1, 2).reshape(M, H) @ w["wo"]
    gu = x @ w["gu"]
    g, u = gu.chunk(2, dim=1)
    return x + (F.silu(g) * u) @ w["down"]


slots = [{k: torch.empty(*v, dtype=bf, device=dev) for k, v in SHAPES.items()} for _ in range(2)]
one = {k: torch.empty(*v, dtype=bf, device=dev) for k, v in SHAPES.items()}
side = torch.cuda.Stream()


def run_bf16():
    x = x0
    for w in layers16:
        x = layer(x, w)
    return x


def run_serial():
    x = x0
    for lw in layers4:
        for k in SHAPES:
            deq(lw[k], one[k])
        x = layer(x, one)  # (dequant of all four first: the same bytes; order inside a layer differs little)
    return x


def run_serial_inline():
    x = x0
    for lw in layers4:
        w = {}
        class Lazy(dict):
            def __getitem__(self, k):
                deq(lw[k], one[k])
                return one[k]
        x = layer(x, Lazy())
    return x


def run_dequant():
    for lw in layers4:
        for k in SHAPES:
            deq(lw[k], one[k])
    return one["wo"]


def run_overlap():
    main = torch.cuda.current_stream()
    ready = [torch.cuda.Event() for _ in range(L)]
    free = [torch.cuda.Event() for _ in range(L)]
    side.wait_stream(main)
    with torch.cuda.stream(side):
        for k in SHAPES:
            deq(layers4[0][k], slots[0][k])
        ready[0].record(side)
    x = x0
    for i in range(L):
        if i + 1 < L:
            with torch.cuda.stream(side):
                if i >= 1:
                    side.wait_event(free[i - 1])
                for k in SHAPES:
                    deq(layers4[i + 1][k], slots[(i + 1) % 2][k])
                ready[i + 1].record(side)
        main.wait_event(ready[i])
        x = layer(x, slots[i % 2])
        free[i].record(main)
    main.wait_stream(side)
    return x


ORDER = list(SHAPES)


def run_overlap_p():
    """One projection ahead: slot per projection kind x 2 (layer parity)."""
    main = torch.cuda.current_stream()
    seq = [(i, k) for i in range(L) for k in ORDER]
    ready, free = {}, {}
    side.wait_stream(main)

    def issue(j):
        i, k = seq[j]
        with torch.cuda.stream(side):
            if i >= 2 or (i >= 1 and False):
                pass
            prev = (i - 2, k)
            if prev in free:
                side.wait_event(free[prev])
            deq(layers4[i][k], slots[i % 2][k])
            e = torch.cuda.Event(); e.record(side); ready[(i, k)] = e

    issue(0); issue(1)
    nxt = 2
    x = x0

    class Staged(dict):
        def __init__(self, i):
            self.i = i
        def __getitem__(self, k):
            nonlocal nxt
            main.wait_event(ready[(self.i, k)])
            if nxt < len(seq):
                issue(nxt); nxt += 1
            return slots[self.i % 2][k]

    for i in range(L):
        x = layer(x, Staged(i))
        for k in ORDER:
            e = torch.cuda.Event(); e.record(main); free[(i, k)] = e
    main.wait_stream(side)
    return x


def graph(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


variants = {"bf16": run_bf16, "serial": run_serial, "serial_inline": run_serial_inline, "overlap": run_overlap,
            "overlap_p": run_overlap_p, "dequant": run_dequant}
graphs = {}
for name, fn in variants.items():
    graphs[name] = graph(fn)
    print("captured", name, flush=True)
ref = graphs["bf16"][1]
for name in ("serial", "serial_inline", "overlap", "overlap_p"):
    graphs[name][0].replay(); graphs["bf16"][0].replay(); torch.cuda.synchronize()
    err = ((graphs[name][1].float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    print(f"{name}: max abs diff vs bf16 (relative to max) {err:.3e}")
times = {n: [] for n in graphs}
for r in range(25):
    for n, (g, _) in graphs.items():
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        if r >= 3:
            times[n].append(a.elapsed_time(b))
print(f"layers {L}, prompt {M}; median ms per prefill (p10-p90)")
for n, t in times.items():
    t.sort()
    print(f"  {n:14s} {statistics.median(t):8.3f}  ({t[len(t)//10]:.3f}-{t[-len(t)//10-1]:.3f})")
b = statistics.median(times["bf16"])
for n in ("serial", "serial_inline", "overlap", "overlap_p"):
    print(f"  {n} / bf16 = {statistics.median(times[n]) / b:.3f}x")
