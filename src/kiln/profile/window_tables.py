"""What a profiled window (decode steps, prefills) shares: its GPU timeline as markdown tables,
what to say when the trace has no GPU timeline, the verdict's order, and its summary files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.safe_io import write_atomic, write_json


def no_timeline(device_type: str, what: str) -> dict[str, Any]:
    """The `gpu` entry of a window without device events: why there are none."""
    return {"status": "n/a", "reason": f"no CUDA device: the GPU timeline (kernels, gaps, {what}) is measured on "
            "CUDA only" if device_type != "cuda" else
            "the trace holds no kernel events (CUPTI unavailable or busy in another profiler?)"}


def no_timeline_verdict(cpu: dict[str, Any], unit: str) -> str:
    """The verdict without a GPU timeline: the host op taking most time."""
    top = cpu["top"][0] if cpu["top"] else None
    return "no GPU timeline on this device" + (
        f"; the host op taking most time is {top['name']} ({top['self_ms_per_step']:.3f} ms/{unit}, "
        f"{100 * top['share']:.0f}% of host time)" if top else "")


def timeline_tables(s: dict[str, Any], unit: str, busy_note: str) -> list[str]:
    """Markdown lines of a window summary's GPU timeline (per `unit`), top kernels, host ops and trace."""
    gpu, lines = s["gpu"], []
    if gpu.get("status") == "ok":
        idle = gpu["idle"]
        lines += [f"| per {unit} | value |", "|---|---|",
                  f"| GPU span | {gpu['span_ms_per_step']:.3f} ms |",
                  f"| GPU busy | {idle['busy_ms_per_step']:.3f} ms{busy_note} |",
                  f"| GPU idle between kernels | {idle['idle_ms_per_step']:.3f} ms ({100 * idle['idle_frac']:.1f}%) |",
                  f"| kernels | {gpu['kernels_per_step']:.0f} (median gap {idle['gap_us_median']:.1f} us) |", "",
                  f"| kernel | calls/{unit} | avg us | share of kernel time | exclusive us/{unit} | started early, "
                  "median us |", "|---|---|---|---|---|---|"]
        lines += [f"| `{_short(k['name'])}` | {k['calls_per_step']:.2f} | {k['avg_us']:.1f} | {100 * k['share']:.1f}% | "
                  f"{k['excl_us_per_step']:.1f} | {_early(k)} |" for k in gpu["top_kernels"]]
        lines += ["", "Exclusive: how far the GPU's timeline advanced while the kernel was the latest to end. A kernel "
                  "launched early (programmatic dependent launch) waits for its predecessor inside its own duration, "
                  "so its avg us overstates it; the exclusive times add up to the busy time. Started early: how long "
                  "before the kernels before it ended a call started (placed on the GPU while they still ran)."]
    else:
        lines += [f"GPU: n/a ({gpu['reason']}).", ""]
    lines += ["", f"| host op | calls/{unit} | self ms/{unit} |", "|---|---|---|"]
    lines += [f"| `{_short(op['name'])}` | {op['calls_per_step']:.2f} | {op['self_ms_per_step']:.3f} |"
              for op in s["cpu"]["top"]]
    if s.get("trace"):
        lines += ["", f"Trace: `{s['trace']}` beside this file (open in https://ui.perfetto.dev)."]
    return lines


def _early(kernel: dict[str, Any]) -> str:
    """Its median start before the kernels before it ended; `-` in a summary written before kiln measured it."""
    return f"{kernel['early_us_median']:.1f}" if "early_us_median" in kernel else "-"


def _short(name: str, width: int = 80) -> str:
    name = name.replace("|", "\\|").replace("`", "'")
    return name if len(name) <= width else name[: width - 1] + "…"


def ranked(causes: list[tuple[float, str]], none_text: str) -> str:
    """A verdict: the causes' texts, the largest loss (ms) first; `none_text` when there is none."""
    if not causes:
        return none_text
    return "; ".join(text for _, text in sorted(causes, key=lambda c: -c[0]))


def save_summary(out_dir: Path, trace: Path, summary: dict[str, Any], markdown) -> dict[str, Any]:
    """Write `summary` (naming `trace`, beside it) as out_dir/summary.json and `markdown(summary)` as
    out_dir/summary.md; returns the summary."""
    summary["trace"] = trace.name
    write_json(out_dir / "summary.json", summary)
    write_atomic(out_dir / "summary.md", markdown(summary))
    return summary
