"""Reading a torch.profiler (Kineto) Chrome trace: kernels by kind, idle gaps, CPU op self times.

The trace is the artifact users open in Perfetto; analysing the same file keeps the summary and
the picture in agreement and lets any saved trace be summarised again. Device events are those
with `cat` kernel / gpu_memcpy / gpu_memset (Kineto's names); host ops are `cpu_op`.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")

# Heuristics by kernel name. Inductor names its generated kernels triton_{poi,red,per,tem}_...;
# cuBLAS/cuBLASLt kernels carry gemm/nvjet/cutlass/xmma in their names; NCCL's start with nccl.
TRITON = re.compile(r"^triton_|^triton\b", re.IGNORECASE)
MATMUL = re.compile(r"gemm|gemv|nvjet|cutlass|xmma|wgmma|cublas|matmul|splitkreduce|triton_tem_fused_\w*mm"
                    r"|\baten::(?:mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm)\b", re.IGNORECASE)
# Fused attention (FlashAttention, cuDNN's SDPA, xFormers' fmha, the SDPA ops on the host): their
# kernels run tensor-core MMAs too (cuDNN's names carry `wgmma`), but count as attention, not matmul,
# so a profile separates the GEMMs from the attention.
ATTENTION = re.compile(r"flash|fmha|sdpa|attention|_attn\b|\battn_", re.IGNORECASE)
COMM = re.compile(r"nccl|gloo|c10d::|all_?reduce|all_?gather|reduce_?scatter|broadcast|sendrecv|all_?to_?all",
                  re.IGNORECASE)


def load_trace(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def kinds(name: str, cat: str) -> set[str]:
    """The kinds a device event counts towards (a Triton matmul template is both; a fused
    attention kernel is attention, not matmul)."""
    if cat == "gpu_memcpy":
        return {"memcpy"}
    if cat == "gpu_memset":
        return {"memset"}
    out = set()
    if TRITON.search(name):
        out.add("triton")
    if ATTENTION.search(name):
        out.add("attention")
    elif MATMUL.search(name):
        out.add("matmul")
    if COMM.search(name):
        out.add("communication")
    return out or {"other"}


def device_events(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS and "dur" in e),
                  key=lambda e: float(e["ts"]))


def step_annotations(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The host-side ProfilerStep#N ranges, in order."""
    steps = [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") in ("user_annotation", "cpu_op", None)]
    return sorted(steps, key=lambda e: float(e["ts"]))


def merge_intervals(spans: Iterable[tuple[float, float]]) -> list[list[float]]:
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def idle_gaps(kernels: list[dict[str, Any]], steps: int, top: int = 5) -> dict[str, Any]:
    """GPU idle time between device events over the window from the first start to the last end.

    Kernels on several streams overlap; their union is the busy time and everything else is idle:
    on a launch-bound step the GPU finishes each kernel before the host has launched the next, so
    idle time dominates. Times in the trace are microseconds.
    """
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in kernels]
    merged = merge_intervals(spans)
    start, end = merged[0][0], merged[-1][1]
    busy = sum(b - a for a, b in merged)
    gaps = []
    for prev, nxt in zip(merged, merged[1:]):
        gaps.append((nxt[0] - prev[1], prev[1], nxt[0]))
    ends = sorted((float(e["ts"]) + float(e["dur"]), e["name"]) for e in kernels)
    starts = sorted((float(e["ts"]), e["name"]) for e in kernels)

    def ended_at(t: float) -> str:  # the last event to finish before the gap
        i = bisect.bisect_right(ends, (t, "\uffff")) - 1
        return ends[i][1] if i >= 0 else ""

    def started_at(t: float) -> str:  # the first event after it
        i = bisect.bisect_left(starts, (t, ""))
        return starts[i][1] if i < len(starts) else ""

    largest = sorted(gaps, reverse=True)[:top]
    sizes = sorted(g[0] for g in gaps)
    span = end - start
    return {
        "gpu_span_ms": span / 1e3,
        "gpu_busy_ms": busy / 1e3,
        "idle_ms": (span - busy) / 1e3,
        "idle_frac": (span - busy) / span if span > 0 else 0.0,
        "idle_ms_per_step": (span - busy) / 1e3 / steps,
        "busy_ms_per_step": busy / 1e3 / steps,
        "gaps": len(gaps),
        "gaps_per_step": len(gaps) / steps,
        "gap_us_median": sizes[len(sizes) // 2] if sizes else 0.0,
        "gaps_over_10us": sum(s > 10 for s in sizes),
        "largest_gaps": [
            {"us": g, "at_ms": (a - start) / 1e3, "after": ended_at(a), "before": started_at(b)}
            for g, a, b in largest
        ],
    }


def _length(merged: list[list[float]]) -> float:
    return sum(b - a for a, b in merged)


def _overlap(a: list[list[float]], b: list[list[float]]) -> float:
    """Total length of the intersection of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def exposed_communication(kernels: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Communication the step cannot hide: the time some collective kernel (NCCL) runs while no
    other kernel does, on any stream. FSDP2's all-gathers and reduce-scatters run on their own
    streams; what overlaps compute costs the step nothing but bandwidth, what does not is time
    the GPU spends waiting on the network. `exposed_frac`: that share of the collectives' time."""
    comm, compute = [], []
    for e in kernels:
        span = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        (comm if "communication" in kinds(e["name"], e["cat"]) else compute).append(span)
    comm_union, compute_union = merge_intervals(comm), merge_intervals(compute)
    busy = _length(comm_union)
    exposed = busy - _overlap(comm_union, compute_union)
    return {"comm_ms_per_step": busy / 1e3 / steps, "exposed_ms_per_step": exposed / 1e3 / steps,
            "exposed_frac": exposed / busy if busy > 0 else 0.0}


def kernel_table(kernels: list[dict[str, Any]], steps: int, top: int = 15) -> tuple[list[dict[str, Any]], dict]:
    """Top device events by total time, and GPU time per kind (shares of the summed kernel time).
    Each row also has its exclusive time (`excl_us_per_step`): how far the GPU's timeline advanced
    while one of its events was the latest to end. Overlapping events (two streams, or a kernel
    launched early by programmatic dependent launch that waits for its predecessor) count their
    shared time once, for the earlier; the exclusive times add up to the GPU's busy time.
    `early_us_median`: the median of how long before the timeline's end (the latest end of the
    events before it) each call started, 0 for one that started after it: a kernel placed on the
    GPU while the one before it still ran."""
    by_name: dict[str, list[float]] = defaultdict(list)
    by_kind: dict[str, float] = defaultdict(float)
    exclusive: dict[str, float] = defaultdict(float)
    early: dict[str, list[float]] = defaultdict(list)
    total = 0.0
    end = None
    for e in sorted(kernels, key=lambda e: float(e["ts"])):
        start, dur = float(e["ts"]), float(e["dur"])
        exclusive[e["name"]] += max(0.0, start + dur - max(start, end if end is not None else start))
        early[e["name"]].append(max(0.0, end - start) if end is not None else 0.0)
        end = start + dur if end is None else max(end, start + dur)
        by_name[e["name"]].append(dur)
        total += dur
        for kind in kinds(e["name"], e["cat"]):
            by_kind[kind] += dur
    rows = sorted(({"name": n, "calls_per_step": len(d) / steps, "total_ms": sum(d) / 1e3,
                    "avg_us": sum(d) / len(d), "share": sum(d) / total if total else 0.0,
                    "excl_us_per_step": exclusive[n] / steps, "early_us_median": statistics.median(early[n])}
                   for n, d in by_name.items()), key=lambda r: -r["total_ms"])
    share = {k: {"ms_per_step": by_kind.get(k, 0.0) / 1e3 / steps, "share": by_kind.get(k, 0.0) / total if total else 0.0}
             for k in ("triton", "matmul", "attention", "communication", "memcpy", "memset", "other")}
    return rows[:top], {"kernel_ms_per_step": total / 1e3 / steps, "kernels_per_step": len(kernels) / steps,
                        "by_kind": share}


def gpu_timeline(events: Iterable[dict[str, Any]], steps: int, top: int = 12) -> dict[str, Any] | None:
    """A window's GPU figures per step (`steps`: decode steps, prefills, ...): kernel time by kind,
    the top kernels, idle gaps and the span from the first start to the last end; None without
    device events."""
    kernels = device_events(events)
    if not kernels:
        return None
    rows, totals = kernel_table(kernels, steps, top=top)
    idle = idle_gaps(kernels, steps, top=5)
    return {"status": "ok", **totals, "idle": idle, "top_kernels": rows,
            "span_ms_per_step": idle["gpu_span_ms"] / steps}


def cpu_self_times(events: Iterable[dict[str, Any]], steps: int, top: int = 15) -> dict[str, Any]:
    """Host ops by self time (their duration minus that of the ops nested in them, per thread)."""
    by_thread: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and "dur" in e:
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    self_us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for ops in by_thread.values():
        ops.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack: list[list] = []  # [end, name, child time]
        for e in ops:
            start, dur = float(e["ts"]), float(e["dur"])
            while stack and stack[-1][0] <= start:
                end, name, child = stack.pop()
                self_us[name] += child
            if stack:
                stack[-1][2] -= dur  # its time is the parent's child time
            stack.append([start + dur, e["name"], dur])
            calls[e["name"]] += 1
        for _, name, rest in stack:
            self_us[name] += rest
    total = sum(self_us.values())
    rows = sorted(({"name": n, "calls_per_step": calls[n] / steps, "self_ms_per_step": t / 1e3 / steps,
                    "share": t / total if total else 0.0} for n, t in self_us.items()), key=lambda r: -r["self_ms_per_step"])
    by_kind = defaultdict(float)
    for n, t in self_us.items():
        for kind in kinds(n, "cpu_op") - {"triton"}:
            by_kind[kind] += t
    return {"cpu_self_ms_per_step": total / 1e3 / steps, "top": rows[:top],
            "by_kind": {k: {"ms_per_step": by_kind.get(k, 0.0) / 1e3 / steps,
                            "share": by_kind.get(k, 0.0) / total if total else 0.0}
                        for k in ("matmul", "attention", "communication", "other")}}
