"""Where a prefill's time goes (the time to first token): prefills under torch.profiler, summarised.

A prefill (one forward over the prompts, writing the KV cache) is matmuls over many rows: it should
take about `FLOPs / the best matmul rate`. When it takes longer, the trace says which of three
things is to blame:
- **gaps**: the GPU waits between kernels because the host launches them one by one (an eager
  prefill, or opaque ops launched from Python inside a compiled one: dispatch, Triton launches);
  compiling them or launching fewer kernels helps;
- **kernels**: the kernels run back to back but compute below the best matmul's rate (small
  matmuls, attention, elementwise kernels, or a weight written out before its matmul);
- **host**: the wall time exceeds the GPU's span (host work before the first kernel or after the
  last: preparing the request, synchronising).
The window runs on the engine's own request shape after its warm-up, so it measures what the timed
prefills ran, not a compile. Summaries come from the exported trace (kiln.profile.trace).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kiln.llm.engine import Engine
from kiln.profile.trace import cpu_self_times, gpu_timeline, load_trace
from kiln.profile.window import recorded_window
from kiln.profile.window_tables import no_timeline, no_timeline_verdict, ranked, save_summary, timeline_tables

GAP_BOUND = 0.15
"""Idle share of the GPU's span above which the verdict names the gaps between kernels."""
KERNEL_BOUND = 0.6
"""Compute rate while busy, as a share of the best matmul's, below which it names the kernels."""
HOST_BOUND = 1.15
"""Wall time over the GPU's span above which it names the host."""


@torch.inference_mode()
def record_prefill(engine: Engine, prompts: Sequence[Sequence[int]], *, new_tokens: int, calls: int,
                   trace_path: Path) -> float:
    """One untimed prefill of `prompts` (its compile, if this shape has none yet), then `calls` more
    under the profiler, each preparing its request as a timed prefill does; the trace goes to
    `trace_path`. Returns the window's wall seconds (synchronised at both edges)."""
    if calls < 1:
        raise ValueError(f"a prefill window needs at least one prefill, got {calls}")
    engine.run_prefill(engine.prepare(prompts, max_new_tokens=new_tokens))

    def window() -> None:
        for _ in range(calls):
            engine.run_prefill(engine.prepare(prompts, max_new_tokens=new_tokens))

    return recorded_window(engine.device, "kiln.prefill_window", window, trace_path)


def summarise_prefill(events: list[dict[str, Any]], *, calls: int, wall_s: float, device_type: str,
                      flops_per_call: int | None, matmul_flops_per_s: float | None) -> dict[str, Any]:
    """Per-prefill figures of a prefill window's trace events, and what bounds the prefill."""
    out: dict[str, Any] = {"calls": calls, "wall_ms_per_call": wall_s * 1e3 / calls, "flops_per_call": flops_per_call,
                           "cpu": cpu_self_times(events, calls, top=10)}
    if flops_per_call and matmul_flops_per_s:
        out["floor_ms_per_call"] = flops_per_call / matmul_flops_per_s * 1e3
        out["wall_compute_frac"] = flops_per_call / (wall_s / calls) / matmul_flops_per_s
    gpu = gpu_timeline(events, calls) if device_type == "cuda" else None
    if gpu is None:
        out["gpu"] = no_timeline(device_type, "compute rate while busy")
        out["verdict"] = no_timeline_verdict(out["cpu"], "prefill")
        return out
    busy_s = gpu["idle"]["busy_ms_per_step"] / 1e3
    if flops_per_call and matmul_flops_per_s and busy_s > 0:
        gpu["busy_compute_frac"] = flops_per_call / busy_s / matmul_flops_per_s
    out["gpu"] = gpu
    out["verdict"] = verdict(out)
    return out


def verdict(s: dict[str, Any]) -> str:
    """One line: what the time above the compute floor is spent on, largest first."""
    gpu = s["gpu"]
    idle, wall, span = gpu["idle"], s["wall_ms_per_call"], gpu["span_ms_per_step"]
    causes = []
    if wall > HOST_BOUND * span:
        causes.append((wall - span, f"host: {wall - span:.3f} ms/prefill beyond the GPU's span (host work before the "
                                    "first kernel or after the last)"))
    if idle["idle_frac"] > GAP_BOUND:
        causes.append((idle["idle_ms_per_step"],
                       f"gaps: the GPU idles {idle['idle_ms_per_step']:.3f} ms/prefill ({100 * idle['idle_frac']:.0f}% "
                       f"of its span) over {gpu['kernels_per_step']:.0f} kernels/prefill (median gap "
                       f"{idle['gap_us_median']:.1f} us): the host launches slower than the GPU runs (an eager prefill, "
                       "or ops launched from Python inside a compiled one: compile them, or launch fewer kernels)"))
    frac = gpu.get("busy_compute_frac")
    if frac is not None and frac < KERNEL_BOUND and s.get("floor_ms_per_call"):
        lost = idle["busy_ms_per_step"] - s["floor_ms_per_call"]
        causes.append((lost, f"kernels: while busy the GPU computes at {100 * frac:.0f}% of the best matmul's rate "
                             f"({lost:.3f} ms/prefill above the floor)"))
    return ranked(causes, "near the compute floor: no gap, kernel or host loss above the bounds")


def profile_prefill(engine: Engine, prompts: Sequence[Sequence[int]], *, new_tokens: int, calls: int, out_dir: Path,
                    flops_per_call: int | None, matmul_flops_per_s: float | None, title: str) -> dict[str, Any]:
    """Record a window (`record_prefill`), summarise its trace and write `out_dir`/summary.{json,md}
    beside it. `flops_per_call`: one prefill's FLOPs (all its prompts)."""
    trace = out_dir / "trace.pt.trace.json.gz"
    wall = record_prefill(engine, prompts, new_tokens=new_tokens, calls=calls, trace_path=trace)
    summary = summarise_prefill(load_trace(trace), calls=calls, wall_s=wall, device_type=engine.device.type,
                                flops_per_call=flops_per_call, matmul_flops_per_s=matmul_flops_per_s)
    return save_summary(out_dir, trace, summary, lambda s: render_prefill_profile(s, title))


def render_prefill_profile(s: dict[str, Any], title: str) -> str:
    """The summary as markdown: per-prefill figures, the verdict, the top kernels and host ops."""
    flops = s.get("flops_per_call")
    lines = [f"# {title}", "", f"{s['calls']} prefills under torch.profiler: **{s['wall_ms_per_call']:.3f} ms/prefill** "
             "wall" + (f"; {_flops(flops)} per prefill." if flops else ".")]
    if s.get("floor_ms_per_call"):
        lines[-1] += (f" Compute floor {s['floor_ms_per_call']:.3f} ms/prefill at the best matmul's rate: the wall "
                      f"time reaches {100 * s['wall_compute_frac']:.1f}% of it.")
    lines += ["", f"**What bounds it:** {s['verdict']}", ""]
    frac = s["gpu"].get("busy_compute_frac")
    lines += timeline_tables(s, "prefill", f" ({100 * frac:.1f}% of the best matmul's rate while busy)" if frac else "")
    return "\n".join(lines) + "\n"


def _flops(flops: int) -> str:
    """FLOPs in the largest unit that leaves at least 1 (a tiny model's prefill is MFLOPs)."""
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if flops >= scale:
            return f"{flops / scale:.3f} {unit}"
    return f"{flops} FLOP"
