"""Collective bandwidth at the sizes a model communicates, as nccl-tests defines it.

Run on every rank of a process group (`kiln bench comm` starts one through torchrun). For each
(collective, size): warm up, then the median of `repeats` samples of back-to-back calls
(kiln.timing), per rank; the slowest rank's median is the figure, since a collective ends when
its last participant does. Bandwidths follow nccl-tests' PERFORMANCE.md:

    algbw = size / time
    busbw = algbw * 2(n-1)/n   (all-reduce)
    busbw = algbw * (n-1)/n    (all-gather, reduce-scatter; size = the full, gathered buffer)

busbw is comparable across world sizes and collectives: it is the bandwidth each link achieves in a
ring. The latency/bandwidth fit `time = latency + size * factor / busbw` per collective (relative
least squares over the measured sizes) gives kiln.bench.scale.predict its alpha and beta. The overlap
probe times a matmul chain as long as the largest collective, alone and concurrently with it: the
share of the shorter one that still shows in the joint time is the `overlap_cost` the predictor
charges for communication hidden behind compute (NCCL kernels take SMs and memory bandwidth).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kiln.bench.scale.predict import OPS, bus_factor
from kiln.distributed.traffic import StepTraffic
from kiln.distributed.world import gather_floats
from kiln.timing import measure, measure_interleaved

# Extra sizes (bytes) around the model's own, so the latency/bandwidth fit spans small and large.
SWEEP = tuple(4096 * 8**k for k in range(7))  # 4 KiB .. 1 GiB; capped at the largest model size
TARGET_SAMPLE_S = 2e-3  # calls per sample: enough that one sample lasts about this long


@dataclass(frozen=True)
class Size:
    op: str
    nbytes: int
    per_step: dict[str, int]
    """{strategy: how many such collectives one step issues}; empty for sweep sizes."""


def plan_sizes(traffic: list[StepTraffic], *, sweep: bool = True) -> list[Size]:
    """The distinct (op, size) pairs the strategies issue, plus sweep sizes per op for the fit."""
    found: dict[tuple[str, int], dict[str, int]] = {}
    for t in traffic:
        for (op, nbytes), count in t.sizes().items():
            found.setdefault((op, nbytes), {})[t.strategy] = count
    ops = sorted({op for op, _ in found}, key=OPS.index) or ["all_reduce"]
    if sweep:
        for op in ops:
            largest = max([n for o, n in found if o == op] or [SWEEP[3]])
            for nbytes in SWEEP:
                if nbytes <= largest:
                    found.setdefault((op, nbytes), {})
    return [Size(op, n, counts) for (op, n), counts in sorted(found.items(), key=lambda kv: (OPS.index(kv[0][0]), kv[0][1]))]


def _buffers(op: str, nbytes: int, world: int, device: torch.device):
    """(input, output) float32 tensors holding `nbytes` (rounded up to a multiple of 4 * world)."""
    numel = max(world, -(-nbytes // 4))
    numel = -(-numel // world) * world
    full = torch.ones(numel, device=device)
    if op == "all_reduce":
        return full, full
    shard = torch.ones(numel // world, device=device)
    return (shard, full) if op == "all_gather" else (full, shard)


def _call(op: str, inp: torch.Tensor, out: torch.Tensor, *, async_op: bool = False):
    if op == "all_reduce":
        return dist.all_reduce(inp, async_op=async_op)
    # torch 2.13 renames the tensor forms *_single; 2.6-2.12 only have the old names.
    if op == "all_gather":
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return fn(out, inp, async_op=async_op)
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, async_op=async_op)


def _max_over_ranks(value: float, device: torch.device) -> float:
    return max(r[0] for r in gather_floats([value], device))


def measure_size(size: Size, *, world: int, device: torch.device, warmup: int, repeats: int) -> dict:
    """One row: time per call (slowest rank's median), algbw and busbw in GB/s."""
    inp, out = _buffers(size.op, size.nbytes, world, device)
    nbytes = (inp if size.op != "all_gather" else out).numel() * 4

    def run() -> None:
        _call(size.op, inp, out)

    first = measure(run, warmup=warmup, repeats=1, device=device).median_s
    # Every rank must issue the same number of collectives: agree on the slowest rank's estimate.
    calls = max(1, min(50, math.ceil(TARGET_SAMPLE_S / max(_max_over_ranks(first, device), 1e-9))))
    timing = measure(run, warmup=0, repeats=repeats, calls_per_sample=calls, device=device)
    t = _max_over_ranks(timing.median_s / calls, device)
    algbw = nbytes / t
    return {
        "kind": "comm", "status": "ok", "op": size.op, "bytes": nbytes, "world": world,
        "used_by": ",".join(f"{k} x{v}" for k, v in size.per_step.items()) or "sweep",
        "time_us": t * 1e6, "algbw_GBps": algbw / 1e9, "busbw_GBps": algbw * bus_factor(size.op, world) / 1e9,
        "calls_per_sample": calls, "samples": repeats,
    }


def fit_latency_bandwidth(rows: list[dict]) -> list[dict]:
    """Per op: `latency_us` and `busbw_GBps` of time = latency + bytes * factor / busbw, fitted by
    least squares on relative error (times span orders of magnitude, so each size counts alike)."""
    import numpy as np

    out = []
    for op in OPS:
        pts = [r for r in rows if r.get("kind") == "comm" and r["op"] == op and r["status"] == "ok"]
        if not pts:
            continue
        world = pts[0]["world"]
        x = np.array([r["bytes"] * bus_factor(op, world) for r in pts], dtype=np.float64)
        t = np.array([r["time_us"] * 1e-6 for r in pts], dtype=np.float64)
        if len(pts) >= 2:
            a = np.stack([np.ones_like(x), x], axis=1) / t[:, None]
            (alpha, inv_bw), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        else:
            alpha, inv_bw = 0.0, t[0] / x[0]
        if inv_bw <= 0:  # no measurable bandwidth term: the best measured busbw stands in
            inv_bw = 1 / max(x / t)
        alpha = max(0.0, float(alpha))
        pred = alpha + x * inv_bw
        out.append({
            "kind": "comm_fit", "status": "ok", "op": op, "world": world, "latency_us": alpha * 1e6,
            "busbw_GBps": 1 / inv_bw / 1e9, "fit_max_rel_err": float(np.max(np.abs(pred - t) / t)), "points": len(pts),
        })
    return out


def measure_overlap(nbytes: int, *, world: int, device: torch.device, warmup: int, repeats: int) -> dict:
    """Matmuls alone, an all-reduce of `nbytes` alone, and both at once (the all-reduce async on the
    backend's stream / thread), interleaved; overlap_cost = (both - max) / min, clamped to [0, 1]."""
    inp, out = _buffers("all_reduce", nbytes, world, device)
    n = 4096 if device.type == "cuda" else 256
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)

    def matmul() -> None:
        a @ a

    one_mm = measure(matmul, warmup=warmup, repeats=max(5, repeats // 2), device=device).median_s
    comm_t = measure(lambda: _call("all_reduce", inp, out), warmup=warmup, repeats=max(5, repeats // 2),
                     device=device).median_s
    k = max(1, round(_max_over_ranks(comm_t, device) / max(_max_over_ranks(one_mm, device), 1e-9)))
    k = min(k, 10_000)

    def compute() -> None:
        for _ in range(k):
            a @ a

    def comm() -> None:
        _call("all_reduce", inp, out)

    def both() -> None:
        work = _call("all_reduce", inp, out, async_op=True)
        compute()
        work.wait()

    times = measure_interleaved({"compute": compute, "comm": comm, "both": both}, warmup=1, repeats=repeats,
                                device=device)
    tc, tm, tb = (_max_over_ranks(times[key].median_s, device) for key in ("compute", "comm", "both"))
    cost = (tb - max(tc, tm)) / max(min(tc, tm), 1e-12)
    return {
        "kind": "overlap", "status": "ok", "op": "all_reduce", "bytes": inp.numel() * 4, "world": world,
        "compute_us": tc * 1e6, "comm_us": tm * 1e6, "both_us": tb * 1e6, "matmuls": k,
        "overlap_cost": min(1.0, max(0.0, cost)),
    }


def skipped_rows(sizes: list[Size], world: int, reason: str) -> list[dict]:
    return [{"kind": "comm", "status": "skipped", "op": s.op, "bytes": s.nbytes, "world": world,
             "used_by": ",".join(f"{k} x{v}" for k, v in s.per_step.items()) or "sweep", "reason": reason}
            for s in sizes]


def run_comm(sizes: list[Size], *, device: torch.device, warmup: int = 5, repeats: int = 20,
             overlap: bool = True) -> list[dict]:
    """Every rank calls this with the same sizes; all ranks get the rows (rank 0 writes them)."""
    world = dist.get_world_size()
    rows = []
    for size in sizes:
        try:
            rows.append(measure_size(size, world=world, device=device, warmup=warmup, repeats=repeats))
        except torch.cuda.OutOfMemoryError as exc:  # a size that does not fit: say so and go on
            torch.cuda.empty_cache()
            rows.append({**skipped_rows([size], world, "")[0], "status": "oom", "reason": str(exc)[:200]})
    rows += fit_latency_bandwidth(rows)
    if overlap:
        ok = [r for r in rows if r.get("kind") == "comm" and r["status"] == "ok" and r["used_by"] != "sweep"]
        largest = max((r["bytes"] for r in ok), default=SWEEP[4])
        rows.append(measure_overlap(largest, world=world, device=device, warmup=warmup, repeats=repeats))
    return rows
