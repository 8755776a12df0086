"""Where a decode step's time goes: a window of decode steps under torch.profiler, summarised.

A decode step (one token per row) should take `bytes read per step / bandwidth`. When it takes
longer, the trace says which of three things is to blame:
- **gaps**: the GPU waits between kernels (launches, or the tail of one kernel and the start of
  the next inside a CUDA graph); fewer, fused kernels or programmatic dependent launch help;
- **kernels**: the kernels run back to back but read the weights below the copy bandwidth
  (matrix-vector kernels that do not saturate HBM); kernel choice and tuning help;
- **host**: the wall time per step exceeds the GPU's span (the host cannot launch fast enough:
  no CUDA graph, or host work per step).
The window runs on the request shape the engine already compiled and captured (same prompts,
same capacity), so it measures the replayed graph, not a new compile. Summaries are computed
from the exported trace with kiln.profile.trace, so any saved trace can be summarised again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kiln.llm.engine import GRAPH_WARMUP_STEPS, Engine
from kiln.profile.trace import cpu_self_times, gpu_timeline, load_trace
from kiln.profile.window import recorded_window
from kiln.profile.window_tables import no_timeline, no_timeline_verdict, ranked, save_summary, timeline_tables

GAP_BOUND = 0.15
"""Idle share of the GPU's span above which the verdict names the gaps between kernels."""
KERNEL_BOUND = 0.85
"""Bandwidth of the busy time, as a share of the copy bandwidth, below which it names the kernels."""
HOST_BOUND = 1.15
"""Wall time over the GPU's span above which it names the host."""


def window_fits(new_tokens: int) -> int:
    """The most decode steps a profile window may take for requests of `new_tokens` tokens (the
    window runs after GRAPH_WARMUP_STEPS steps of the same request, within its capacity)."""
    return max(0, new_tokens - 1 - GRAPH_WARMUP_STEPS)


def window_steps(steps: int) -> tuple[int, int]:
    """(first, last) decode step of a window of `steps` recorded by `record_decode`, numbered as
    kiln.bench.formulas numbers them (step 1 is the first after the prefill's token)."""
    return GRAPH_WARMUP_STEPS + 1, GRAPH_WARMUP_STEPS + steps


@torch.inference_mode()
def record_decode(engine: Engine, prompts: Sequence[Sequence[int]], *, new_tokens: int, steps: int,
                  trace_path: Path) -> float:
    """Prefill `prompts`, run GRAPH_WARMUP_STEPS decode steps (capturing the graph if this shape
    has none yet), then `steps` more under the profiler; the trace goes to `trace_path`.
    Returns the window's wall seconds (synchronised at both edges)."""
    if not 1 <= steps <= window_fits(new_tokens):
        raise ValueError(f"a window of {steps} decode steps does not fit in requests of {new_tokens} tokens "
                         f"(at most {window_fits(new_tokens)})")
    prep = engine.prepare(prompts, max_new_tokens=new_tokens)
    engine.run_prefill(prep)
    engine.run_decode(prep, GRAPH_WARMUP_STEPS)

    def window() -> None:
        for _ in range(steps):  # one step per call: every step replays the graph captured above
            engine.run_decode(prep, 1)

    return recorded_window(engine.device, "kiln.decode_window", window, trace_path)


def summarise_decode(events: list[dict[str, Any]], *, steps: int, wall_s: float, device_type: str,
                     bytes_per_step: int, copy_bytes_per_s: float | None) -> dict[str, Any]:
    """Per-step figures of a decode window's trace events, and what bounds the step."""
    out: dict[str, Any] = {"steps": steps, "wall_ms_per_step": wall_s * 1e3 / steps,
                           "bytes_per_step": bytes_per_step, "cpu": cpu_self_times(events, steps, top=10)}
    if copy_bytes_per_s:
        out["floor_ms_per_step"] = bytes_per_step / copy_bytes_per_s * 1e3
        out["wall_bandwidth_frac"] = bytes_per_step / (wall_s / steps) / copy_bytes_per_s
    gpu = gpu_timeline(events, steps) if device_type == "cuda" else None
    if gpu is None:
        out["gpu"] = no_timeline(device_type, "bandwidth while busy")
        out["verdict"] = no_timeline_verdict(out["cpu"], "step")
        return out
    busy_s = gpu["idle"]["busy_ms_per_step"] / 1e3
    if copy_bytes_per_s and busy_s > 0:
        gpu["busy_bandwidth_frac"] = bytes_per_step / busy_s / copy_bytes_per_s
    out["gpu"] = gpu
    out["verdict"] = verdict(out)
    return out


def verdict(s: dict[str, Any]) -> str:
    """One line: what the time above the bandwidth floor is spent on, largest first."""
    gpu = s["gpu"]
    idle, wall = gpu["idle"], s["wall_ms_per_step"]
    causes = []
    host_ms = wall - gpu["span_ms_per_step"]
    if wall > HOST_BOUND * gpu["span_ms_per_step"]:
        causes.append((host_ms, f"host: {host_ms:.3f} ms/step beyond the GPU's span (launches not in one CUDA "
                                f"graph, or host work per step)"))
    if idle["idle_frac"] > GAP_BOUND:
        causes.append((idle["idle_ms_per_step"],
                       f"gaps: the GPU idles {idle['idle_ms_per_step']:.3f} ms/step ({100 * idle['idle_frac']:.0f}% "
                       f"of its span) over {gpu['kernels_per_step']:.0f} kernels/step (median gap "
                       f"{idle['gap_us_median']:.1f} us): fuse kernels or use programmatic dependent launch"))
    frac = gpu.get("busy_bandwidth_frac")
    if frac is not None and frac < KERNEL_BOUND and s.get("floor_ms_per_step"):
        lost = idle["busy_ms_per_step"] - s["floor_ms_per_step"]
        causes.append((lost, f"kernels: while busy the GPU reads {100 * frac:.0f}% of the copy bandwidth "
                             f"({lost:.3f} ms/step above the floor): the matrix-vector kernels do not saturate memory"))
    return ranked(causes, "at the bandwidth floor: no gap, kernel or host loss above the bounds")


def profile_decode(engine: Engine, prompts: Sequence[Sequence[int]], *, new_tokens: int, steps: int, out_dir: Path,
                   step_bytes: int, copy_bytes_per_s: float | None, title: str) -> dict[str, Any]:
    """Record a window (`record_decode`), summarise its trace and write `out_dir`/summary.{json,md}
    beside it. `step_bytes`: what a step of the window reads (the weights, and the KV-cache slots its
    rows attend: `window_steps` says which decode steps the window holds)."""
    trace = out_dir / "trace.pt.trace.json.gz"
    wall = record_decode(engine, prompts, new_tokens=new_tokens, steps=steps, trace_path=trace)
    summary = summarise_decode(load_trace(trace), steps=steps, wall_s=wall, device_type=engine.device.type,
                               bytes_per_step=step_bytes, copy_bytes_per_s=copy_bytes_per_s)
    return save_summary(out_dir, trace, summary, lambda s: render_decode_profile(s, title))


def render_decode_profile(s: dict[str, Any], title: str) -> str:
    """The summary as markdown: per-step figures, the verdict, the top kernels (or host ops)."""
    lines = [f"# {title}", "", f"{s['steps']} decode steps under torch.profiler: **{s['wall_ms_per_step']:.3f} "
             f"ms/step** wall; {s['bytes_per_step'] / 1e9:.3f} GB read per step (weights + the KV cache slots a "
             "step attends over)."]
    if s.get("floor_ms_per_step"):
        lines[-1] += (f" Bandwidth floor {s['floor_ms_per_step']:.3f} ms/step: the wall time reaches "
                      f"{100 * s['wall_bandwidth_frac']:.1f}% of the copy bandwidth.")
    lines += ["", f"**What bounds it:** {s['verdict']}", ""]
    busy_bw = s["gpu"].get("busy_bandwidth_frac")
    lines += timeline_tables(s, "step", f" ({100 * busy_bw:.1f}% of copy bandwidth while busy)" if busy_bw else "")
    return "\n".join(lines) + "\n"

