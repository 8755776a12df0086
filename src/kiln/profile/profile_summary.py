"""The profile summary: figures from the trace and the memory window, as JSON and markdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.profile.memory_window import na
from kiln.profile.trace import (
    cpu_self_times,
    device_events,
    exposed_communication,
    idle_gaps,
    kernel_table,
    load_trace,
)

KIND_LABELS = {"triton": "Triton kernels", "matmul": "matmul kernels", "attention": "attention kernels",
               "communication": "communication",
               "memcpy": "memcpy", "memset": "memset", "other": "other kernels"}


def summarise_trace(trace_path: Path, steps: int, device_type: str) -> dict[str, Any]:
    events = load_trace(trace_path)
    out: dict[str, Any] = {"cpu": cpu_self_times(events, steps)}
    if device_type != "cuda":
        out["gpu"] = na("no CUDA device (CPU run): kernels, Triton/matmul/communication shares and idle gaps "
                        "are GPU timeline figures")
        return out
    kernels = device_events(events)
    if not kernels:
        out["gpu"] = na("the trace holds no GPU kernel events (CUPTI unavailable or busy in another profiler?)")
        return out
    top, totals = kernel_table(kernels, steps)
    out["gpu"] = {"status": "ok", **totals, "idle": idle_gaps(kernels, steps),
                  "communication": exposed_communication(kernels, steps), "top_kernels": top}
    return out


def _mib(value: float | None) -> str:
    return "—" if value is None else f"{value / 2**20:,.1f} MiB"


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _short(name: str, width: int = 90) -> str:
    name = name.replace("|", "\\|")
    return name if len(name) <= width else name[: width - 1] + "…"


def render_markdown(s: dict[str, Any]) -> str:
    w = s["window"]
    lines = [f"# kiln profile: {s['model']} ({s['device_name']})", "",
             f"Precision {s['precision']}, compile {s['compile']}, strategy {s['strategy']}, batch {s['batch_size']}. "
             f"{w['steps']} profiled steps after the first step and {w['warmup']} warm-up steps: "
             f"**{w['step_ms']:.3f} ms/step** (wall, synchronised at the window's edges).", "",
             f"Trace: `{s['trace']}` (open in https://ui.perfetto.dev or `tensorboard --logdir` with torch-tb-profiler).",
             ""]
    gpu = s["gpu"]
    lines += ["## GPU time by kind", ""]
    if gpu.get("status") != "ok":
        lines += [f"n/a: {gpu['reason']}", ""]
    else:
        idle = gpu["idle"]
        lines += [f"{gpu['kernels_per_step']:.0f} kernels/step, {gpu['kernel_ms_per_step']:.3f} ms of kernel time/step.",
                  "", "| kind | ms/step | share of kernel time |", "|---|---|---|"]
        lines += [f"| {KIND_LABELS[k]} | {v['ms_per_step']:.3f} | {_pct(v['share'])} |" for k, v in gpu["by_kind"].items()]
        comm = gpu["communication"]
        lines += ["", "Triton matmul templates count as both Triton and matmul; fused attention kernels "
                  "(flash, cuDNN SDPA) as attention only.", "",
                  f"Communication: {comm['comm_ms_per_step']:.3f} ms/step of collective kernels, **exposed "
                  f"{comm['exposed_ms_per_step']:.3f} ms/step** ({_pct(comm['exposed_frac'])} of it ran while no "
                  "other kernel did: what the step loses to collectives not hidden behind compute).", "",
                  "## GPU idle gaps between kernels (the launch-bound signature)", "",
                  f"GPU busy {idle['busy_ms_per_step']:.3f} ms/step, **idle {idle['idle_ms_per_step']:.3f} ms/step = "
                  f"{_pct(idle['idle_frac'])} of the GPU timeline** ({idle['gpu_span_ms']:.2f} ms from the first "
                  f"kernel to the last). {idle['gaps_per_step']:.1f} gaps/step, median {idle['gap_us_median']:.1f} us, "
                  f"{idle['gaps_over_10us']} over 10 us.", "",
                  "| gap us | at ms | after | before |", "|---|---|---|---|"]
        lines += [f"| {g['us']:.1f} | {g['at_ms']:.3f} | {_short(g['after'], 50)} | {_short(g['before'], 50)} |"
                  for g in idle["largest_gaps"]]
        lines += ["", "## Top kernels", "", "| kernel | calls/step | total ms | avg us | share |", "|---|---|---|---|---|"]
        lines += [f"| {_short(r['name'])} | {r['calls_per_step']:.1f} | {r['total_ms']:.3f} | {r['avg_us']:.1f} | "
                  f"{_pct(r['share'])} |" for r in gpu["top_kernels"]]
    cpu = s["cpu"]
    lines += ["", "## Host ops by self time", "",
              f"{cpu['cpu_self_ms_per_step']:.3f} ms of op self time/step; matmul ops "
              f"{_pct(cpu['by_kind']['matmul']['share'])}, communication {_pct(cpu['by_kind']['communication']['share'])}.",
              "", "| op | calls/step | self ms/step | share |", "|---|---|---|---|"]
    lines += [f"| {_short(r['name'])} | {r['calls_per_step']:.1f} | {r['self_ms_per_step']:.3f} | {_pct(r['share'])} |"
              for r in cpu["top"]]
    mem = s["memory"]
    lines += ["", "## Memory", ""]
    cat = mem["by_category"]
    if cat.get("status") == "ok":
        lines += [f"Peak {_mib(cat['peak_bytes'])} of tensors in the memory window (torch.profiler categories):", "",
                  "| category | at the peak | its own maximum |", "|---|---|---|"]
        lines += [f"| {name} | {_mib(cat['at_peak'][name])} | {_mib(cat['max_by_category'][name])} |"
                  for name in sorted(cat["at_peak"], key=lambda n: -cat["at_peak"][n])]
    else:
        lines += [f"By category: n/a: {cat['reason']}"]
    snap = mem["cuda_snapshot"]
    lines.append("")
    if snap.get("status") == "ok":
        lines.append(f"CUDA allocator snapshot `{snap['file']}` (open at https://pytorch.org/memory_viz): reserved "
                     f"{_mib(snap['reserved_bytes'])}, allocated {_mib(snap['allocated_bytes'])}, peak allocated in "
                     f"the window {_mib(snap['window_peak_allocated_bytes'])}, {snap['allocations_in_window']} allocations.")
    else:
        lines.append(f"CUDA allocator snapshot: n/a: {snap['reason']}")
    return "\n".join(lines) + "\n"
