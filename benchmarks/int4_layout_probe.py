"""Probe: would int4@triton's row kernel be faster if a word's eight nibbles held inputs R apart
(nibble j of word r in group g: input g*GROUP + j*R + r, R = GROUP/8) instead of eight adjacent
inputs (8r + j, kiln's layout)? With adjacent inputs, the inputs of nibble position j are a
strided gather: kiln's loop reads the group's inputs once and cuts the eight tiles from them in
registers, then stores each to shared memory (scalar 16-bit stores and a fence) for the tensor
cores. With inputs R apart, each position's tile is a contiguous slice of the input, which
Triton's pipeliner copies to shared memory asynchronously, as it does the words.

One probe kernel holds kiln's loop over a split's groups (scales a group ahead, the weight as the
products' first operand, unpacked in its registers): its group product is kiln's own
(`_swapped_group`, the inputs read once) on kiln's layout, or the same product with each
position's inputs read as a slice (BLOCKED); nothing fused (no norm, SwiGLU, bias or residual),
kiln's ordered sum of the splits, kiln's launch setting for the shape (choose_setting). Per
Llama-3.2-3B projection and row count, on a GPU: kiln's own row kernel, the probe on kiln's
layout (so the probe's own cost is seen) and the probe on the other layout, each captured as
back-to-back calls over weight copies that miss L2, interleaved, median us per call; every
output is checked against the dequantized product.

    python benchmarks/int4_layout_probe.py --out DIR [--rows 16,32] [--repeats 15]

Nothing in kiln uses the other layout: a layout change would touch every int4@triton kernel
(one-row, rows, prefill dequantization) and the packing, so this measures the gain first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from kiln.kernels.int4_groups import _nibble_pair, _swapped_group
from kiln.kernels.triton_launch import arrival_counters, interpreting
from kiln.kernels.triton_matvec import _split_sum

GROUP = 128
VARIANTS = ("kiln rows", "probe adjacent", "probe blocked")


def pack(q: torch.Tensor, blocked: bool) -> torch.Tensor:
    """q [N, K] in [0, 15] -> int32 words [K/8, N]: nibble j of word row r holds input 8r + j
    (kiln.llm.int4_layout.pack_words' layout) or, `blocked`, input g*GROUP + j*R + r of its group g."""
    from kiln.llm.int4_layout import pack_words

    n, k = q.shape
    if blocked:  # kiln's packing of the columns reordered: column 8r + j of a group <- its input j*R + r
        q = q.view(n, k // GROUP, 8, GROUP // 8).transpose(2, 3).reshape(n, k)
    return pack_words(q)


@triton.jit
def _slice_t(X, m, m_ok, k, stride_xm, K: tl.constexpr):
    """x[m, k] as [len(k), BLOCK_M] (the products' second operand), k contiguous."""
    return tl.load(X + m[None, :] * stride_xm + k[:, None], mask=(k < K)[:, None] & m_ok[None, :], other=0.0)


@triton.jit
def _probe(X, Q, Scale, Offset, Y, Part, Arrived, M, N, stride_xm, K: tl.constexpr, GROUP: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, PER_SPLIT: tl.constexpr,
           BLOCKED: tl.constexpr, ASM: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    m_blocks = tl.cdiv(M, BLOCK_M)
    n = (pid // m_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = (pid % m_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok = n < N
    m_ok = m < M
    dtype = X.dtype.element_ty
    MAGIC: tl.constexpr = 0.0 if dtype == tl.float32 else 1024.0 if dtype == tl.float16 else 128.0
    R: tl.constexpr = GROUP // 8
    GROUPS: tl.constexpr = K // GROUP
    r = tl.arange(0, R)
    g0 = pid_k * PER_SPLIT
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)  # no norm: the group product's prologue 0 ignores it
    scale_next = tl.load(Scale + g0 * N + n, mask=(g0 < GROUPS) & n_ok, other=0.0)
    offset_next = tl.load(Offset + g0 * N + n, mask=(g0 < GROUPS) & n_ok, other=0.0)
    for i in tl.range(0, PER_SPLIT):
        g = g0 + i
        g_ok = g < GROUPS
        scale, offset = scale_next.to(tl.float32), offset_next.to(tl.float32)
        ahead = (g + 1 < GROUPS) & (i + 1 < PER_SPLIT)
        scale_next = tl.load(Scale + (g + 1) * N + n, mask=ahead & n_ok, other=0.0)
        offset_next = tl.load(Offset + (g + 1) * N + n, mask=ahead & n_ok, other=0.0)
        if BLOCKED:
            words = tl.load(Q + (g * R + r)[None, :] * N + n[:, None], mask=g_ok & n_ok[:, None], other=0)
            k = g * GROUP + tl.arange(0, GROUP)
            xg = tl.load(X + m[:, None] * stride_xm + k[None, :], mask=m_ok[:, None] & g_ok, other=0.0)
            xsum = tl.sum(xg.to(tl.float32), 1)
            part = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            base = tl.where(g_ok, g * GROUP, K)  # past the last group: masked
            for b in tl.static_range(4):
                lo, hi = _nibble_pair(words, b, dtype, ASM)
                part = tl.dot(lo, _slice_t(X, m, m_ok, base + (2 * b) * R + r, stride_xm, K), part)
                part = tl.dot(hi, _slice_t(X, m, m_ok, base + (2 * b + 1) * R + r, stride_xm, K), part)
        else:  # kiln's own group product (inputs read once, cut into the eight positions' tiles)
            part, xsum, _ = _swapped_group(X, Q, X, g, g_ok, m, m_ok, n, n_ok, stride_xm, rstd, N, K, GROUP, 0, ASM,
                                           BLOCK_M, BLOCK_N, True)
        acc += part * scale[:, None] + xsum[None, :] * (offset - MAGIC * scale)[:, None]
    ok = m_ok[:, None] & n_ok[None, :]
    y, last = _split_sum(tl.trans(acc), Part, Arrived, pid, pid_k, m[:, None], n[None, :], ok, M, N, SPLIT)
    tl.store(Y + m[:, None] * N + n[None, :], y.to(dtype), mask=ok & last)


def probe_rows(x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, blocked: bool,
               setting: tuple[int, int, int, int, int]) -> torch.Tensor:
    """x [M, K] times the int4 weight (`pack`'s words of either layout, scale and offset [K/GROUP, N])
    through the probe kernel at `setting` (BLOCK_N, SPLIT, warps, stages, BLOCK_M)."""
    bn, split, warps, stages, bm = setting
    M, K = x.shape
    N = words.shape[1]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    part = torch.empty(split * M * N if split > 1 else 1, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), split)
    _probe[grid](x, words, scale, offset, y, part, arrival_counters(x.device, N), M, N, x.stride(0), K=K, GROUP=GROUP,
                 BLOCK_M=bm, BLOCK_N=bn, SPLIT=split, PER_SPLIT=-(-(K // GROUP) // split), BLOCKED=blocked,
                 ASM=x.dtype == torch.bfloat16 and not interpreting(), num_warps=warps, num_stages=stages)
    return y


def quantized(out_f: int, in_f: int, device: torch.device, dtype: torch.dtype, seed: int) -> dict:
    """A random int4 weight: q [N, K], scale and offset [K/GROUP, N], and its dequantized W [N, K] in fp32."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randint(0, 16, (out_f, in_f), generator=gen)
    scale = (torch.rand(in_f // GROUP, out_f, generator=gen) * 0.02 + 0.001).to(dtype)
    offset = (-8 * scale.float() + torch.randn(in_f // GROUP, out_f, generator=gen) * 0.001).to(dtype)
    w = q.float() * scale.float().repeat_interleave(GROUP, 0).t() + offset.float().repeat_interleave(GROUP, 0).t()
    return {"q": q.to(device), "scale": scale.to(device), "offset": offset.to(device), "w": w.to(device)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="16,32")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("int4_layout_probe: needs a CUDA device", file=sys.stderr)
        return 2
    import kiln.kernels.triton_rows as tr
    from kiln.llm.config import resolve_model
    from kiln.timing import cuda_graph_of, replay_rounds

    sys.path.insert(0, str(Path(__file__).parent))
    from matvec_bench import L2_BYTES, projections

    dev, dt = torch.device("cuda"), torch.bfloat16
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    graphs, meta, alive = {}, {}, []
    for name, out_f, in_f, _, _ in projections(resolve_model("llama-3.2-3b").config):
        copies = max(2, min(16, -(-3 * L2_BYTES // (out_f * in_f // 2))))
        layers = [quantized(out_f, in_f, dev, dt, seed) for seed in range(copies)]
        for layer in layers:
            layer["adjacent"], layer["blocked"] = pack(layer["q"], False), pack(layer["q"], True)
        alive.append(layers)
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, in_f, device=dev, dtype=dt)
            alive.append(x)
            exact = x.float() @ layers[0]["w"].t()
            bn, split, warps, stages, bm, _, _ = tr.choose_setting(rows, out_f, in_f, GROUP, sms)
            setting = (bn, split, warps, stages, bm)
            calls = {
                "kiln rows": [lambda a=a, x=x: torch.ops.kiln.int4_rows(x, a["adjacent"], a["scale"], a["offset"], GROUP)
                              for a in layers],
                "probe adjacent": [lambda a=a, x=x, s=setting: probe_rows(x, a["adjacent"], a["scale"], a["offset"],
                                                                          False, s) for a in layers],
                "probe blocked": [lambda a=a, x=x, s=setting: probe_rows(x, a["blocked"], a["scale"], a["offset"],
                                                                         True, s) for a in layers],
            }
            for variant in VARIANTS:
                y = calls[variant][0]()
                err = float((y.float() - exact).abs().max() / exact.abs().max())
                key = (name, rows, variant)
                graphs[key] = cuda_graph_of(lambda cs=calls[variant]: [c() for c in cs], 1)
                meta[key] = {"projection": name, "shape": [out_f, in_f], "rows": rows, "variant": variant,
                             "setting": list(setting), "rel_err": err, "calls_per_replay": len(layers)}
            print(f"{name} rows={rows}: ready", flush=True)
    results = []
    for key, samples in replay_rounds(graphs, args.repeats).items():
        us = [ms * 1000 / meta[key]["calls_per_replay"] for ms in samples]
        results.append({**meta[key], "us_per_call": statistics.median(us), "us_min": min(us), "us_max": max(us)})
    for row in results:
        ref = next(r for r in results if r["projection"] == row["projection"] and r["rows"] == row["rows"]
                   and r["variant"] == "probe adjacent")
        row["vs_probe_adjacent"] = row["us_per_call"] / ref["us_per_call"]
    from kiln.bench.results import write_results
    from kiln.monitor.env import collect_env

    rows = [{**r, "status": "ok"} for r in results]
    write_results(args.out, env=collect_env(), config={"repeats": args.repeats, "rows": args.rows},
                  results=rows, columns=["projection", "rows", "variant", "setting", "us_per_call", "vs_probe_adjacent",
                                         "rel_err"],
                  title="int4 row kernel: a word's nibbles R inputs apart (blocked) against adjacent (kiln's layout)",
                  command="python " + " ".join(sys.argv))
    print((Path(args.out) / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
