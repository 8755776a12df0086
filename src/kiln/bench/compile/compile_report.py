"""Showing `kiln bench compile` results: a rich table, results.json/results.md, a PNG chart."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kiln.bench.ratios import annotate, mark_reference_drift, ratio_text
from kiln.bench.results import pyplot, rich_table, write_result_files

# The columns of results.md and of the table on screen, in order.
COLUMNS = [
    "runner", "precision", "loss", "mode", "backend", "scope", "regional", "cudagraphs", "status", "compile_s",
    "compile_warm_s", "warmup_s", "step_ms", "step_ms_p10", "step_ms_p90", "eager_step_ms", "speedup",
    "eager_fp32_step_ms", "speedup_vs_eager_fp32",
    "speedup_vs_plain", "speedup_vs_best_plain", "throughput", "tflops", "peak_frac", "peak_mem_bytes",
    "memory_compression", "graphs",
    "graph_breaks", "recompiles", "accuracy", "capture", "noisy", "reason", "flags",
]
# Model FLOP/s against the datasheet peak beside `peak_frac` (the best matmul measured), and the
# loop settings every row shares (clipping and the schedule cost a plain loop real time).
_AFTER_PEAK = COLUMNS.index("peak_frac") + 1
COLUMNS[_AFTER_PEAK:_AFTER_PEAK] = ["spec_peak_frac", "grad_clip", "schedule", "warmup_steps"]
COLUMNS.insert(COLUMNS.index("step_ms_p90") + 1, "step_ms_alone")


def row_label(row: dict[str, Any]) -> str:
    eager = row.get("mode") == "eager"
    if row.get("runner") == "plain":
        return f"{row['precision']} {row['loss']} plain " + ("eager" if eager else f"{row.get('backend')}/{row.get('mode')}")
    extras = ("+regional" if row.get("regional") else "") + ("+cudagraphs" if row.get("cudagraphs") else "")
    if eager:
        return f"{row['precision']} {row['loss']} eager{extras}"
    return f"{row['precision']} {row['loss']} {row.get('backend')}/{row.get('mode')}/{row.get('scope')}{extras}"


def cell_text(key: str, value: Any) -> str:
    """A figure as the tables show it (`ms`, `MiB`, `1.23x`, `12.3%`)."""
    if value is None:
        return "-"
    if key == "peak_mem_bytes":
        return f"{value / 2**20:.0f} MiB"
    if key in ("speedup", "speedup_vs_eager_fp32", "memory_compression", "speedup_vs_plain", "speedup_vs_best_plain",
               "speedup_vs_default"):
        return f"{value:.2f}x"
    if key in ("peak_frac", "spec_peak_frac"):
        return f"{100 * value:.1f}%"
    if key in ("compile_s", "warmup_s", "compile_warm_s"):
        return f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def render_table(rows: list[dict[str, Any]], title: str):
    """A rich Table of the rows (times in ms, memory in MiB). Each ratio stands beside the eager
    time it divides (every row is timed interleaved with its own eager run: `vs eager` is
    `eager ms / step ms` of the same row), noisy ratios read `~1.5x?` with the reason under the row."""
    mark_reference_drift(rows)
    for row in rows:
        annotate(row)
    shown = ["row", "status", "compile_s", "step_ms", "eager_step_ms", "speedup", "speedup_vs_eager_fp32",
             "throughput", "peak_mem_bytes", "memory_compression", "graphs", "graph_breaks", "recompiles", "accuracy"]
    if any(r.get("precision") != "fp32" and r.get("eager_fp32_step_ms") is not None for r in rows):
        shown.insert(shown.index("speedup_vs_eager_fp32"), "eager_fp32_step_ms")
    if not any(r.get("peak_mem_bytes") for r in rows):  # CPU: not measured
        shown = [k for k in shown if k not in ("peak_mem_bytes", "memory_compression")]
    if any(r.get("peak_frac") is not None for r in rows):
        shown.insert(shown.index("throughput") + 1, "peak_frac")
    if any(r.get("spec_peak_frac") is not None for r in rows):
        shown.insert(shown.index("throughput") + 1, "spec_peak_frac")
    if any(r.get("speedup_vs_best_plain") is not None for r in rows):
        shown.insert(shown.index("throughput"), "speedup_vs_best_plain")
    if any(r.get("compile_warm_s") is not None for r in rows):
        shown.insert(shown.index("step_ms"), "compile_warm_s")
    headers = {"row": "recipe (precision loss backend/mode/scope)", "compile_s": "compile s",
               "compile_warm_s": "warm compile s", "step_ms": "step ms (p10-p90)",
               "eager_step_ms": "eager ms (timed beside)", "eager_fp32_step_ms": "eager fp32 ms", "speedup": "vs eager",
               "speedup_vs_eager_fp32": "vs fp32", "speedup_vs_best_plain": "vs best plain",
               "peak_frac": "of best matmul", "spec_peak_frac": "of datasheet peak",
               "throughput": "samples/s", "peak_mem_bytes": "peak mem", "memory_compression": "mem ratio",
               "graph_breaks": "breaks"}

    def cell(key: str, row: dict[str, Any]) -> str:
        if key == "row":
            return row_label(row)
        if key == "step_ms" and row.get("step_ms") is not None:
            return f"{row['step_ms']:.3f} ({row.get('step_ms_p10', 0):.3f}-{row.get('step_ms_p90', 0):.3f})"
        if key in ("eager_step_ms", "eager_fp32_step_ms") and row.get(key) is not None:
            return f"{row[key]:.3f}"
        if key in ("speedup", "speedup_vs_eager_fp32") and row.get(key) is not None:
            return ratio_text(row[key], bool(row.get("noisy")) and not _definitional(row, key))
        return cell_text(key, row.get(key))

    def notes(row: dict[str, Any]) -> list[str]:
        return [text for text in (row.get("reason"), *(str(row.get("flags") or "").split("; "))) if text]

    return rich_table(rows, title, shown, headers, cell, notes=notes)


def _definitional(row: dict[str, Any], key: str) -> bool:
    """An eager baseline's ratio to itself (1 by definition, whatever the noise)."""
    baseline = row.get("mode") == "eager" and row.get("runner") == "kiln" and not row.get("cudagraphs")
    return baseline and (key == "speedup" or row.get("precision") == "fp32")


def _bar_text(row: dict[str, Any], key: str, ref: str) -> str:
    """A speed bar's label: the ratio and the two times it divides (`1.23x = 12.3/10 ms`)."""
    value = row.get(key)
    if value is None or row.get("step_ms") is None or row.get(ref) is None:
        return ""
    noisy = bool(row.get("noisy")) and not _definitional(row, key)
    return f" {ratio_text(value, noisy)} = {row[ref]:.3g}/{row['step_ms']:.3g} ms"


def plot(rows: list[dict[str, Any]], path: Path, title: str, labels: list[str] | None = None) -> Path | None:
    """Speedup (vs eager at the same precision and vs eager fp32, each bar labelled with the ratio
    and the two times it divides; noisy rows hatched) and, where measured (CUDA), peak memory per
    row (`labels`: the rows' names on the chart, default the recipe). A panel with no data is left out."""
    plt = pyplot()
    if plt is None:
        return None
    mark_reference_drift(rows)
    for row in rows:
        annotate(row)
    labels = labels or [row_label(r) for r in rows]
    y = list(range(len(rows)))
    height = max(2.5, 0.42 * len(rows) + 1.2)
    mem = [(r.get("peak_mem_bytes") or 0) / 2**20 for r in rows]
    if any(mem):
        fig, (ax_speed, ax_mem) = plt.subplots(1, 2, figsize=(14, height), sharey=True,
                                               gridspec_kw={"width_ratios": [3, 2]})
    else:  # CPU: the process RSS peak cannot be reset per row, so no memory is reported
        fig, ax_speed = plt.subplots(1, 1, figsize=(11, height))
        ax_mem = None
    speed = [r.get("speedup") or 0.0 for r in rows]
    vs32 = [r.get("speedup_vs_eager_fp32") or 0.0 for r in rows]
    hatch = ["//" if r.get("noisy") else None for r in rows]
    bars = ax_speed.barh([i - 0.2 for i in y], speed, height=0.4, label="vs eager, same precision (timed beside it)",
                         color="#3b7dd8")
    bars32 = ax_speed.barh([i + 0.2 for i in y], vs32, height=0.4, label="vs eager fp32", color="#9bbbe8")
    for group in (bars, bars32):
        for bar, h in zip(group, hatch, strict=True):
            if h:
                bar.set_hatch(h)
                bar.set_edgecolor("#b00000")
    for i, row in enumerate(rows):
        for offset, key, ref in ((-0.2, "speedup", "eager_step_ms"), (0.2, "speedup_vs_eager_fp32", "eager_fp32_step_ms")):
            text = _bar_text(row, key, ref)
            if text and not (key == "speedup_vs_eager_fp32" and row.get("precision") == "fp32"):
                ax_speed.text(row.get(key) or 0.0, i + offset, text, va="center", fontsize=7)
    right = max([1.0, *speed, *vs32])
    ax_speed.set_xlim(0, right * 1.45)  # room for the labels
    ax_speed.axvline(1.0, color="black", linewidth=0.8)
    noisy = sum(bool(r.get("noisy")) for r in rows)
    ax_speed.set_xlabel("speedup (median eager / median recipe, interleaved)"
                        + (f"; hatched: {noisy} row(s) too noisy to rank" if noisy else ""))
    if ax_mem is not None:
        ax_mem.barh(y, mem, height=0.6, color="#d88a3b")
        ax_mem.set_xlabel("peak device memory over warm-up, MiB")
        for i, row in enumerate(rows):
            if row.get("memory_compression"):
                ax_mem.text(mem[i], i, f" {mem[i]:.0f} MiB, {row['memory_compression']:.2f}x", va="center",
                            fontsize=7)
        ax_mem.set_xlim(0, max(mem) * 1.35)
    for i, row in enumerate(rows):
        if row["status"] != "ok":
            ax_speed.text(0.02, i, row["status"], va="center", fontsize=8, color="#b00000")
    ax_speed.set_yticks(y)
    ax_speed.set_yticklabels(labels, fontsize=8)
    ax_speed.invert_yaxis()
    # Above the bars, never over them (the last row's bars reach the lower right).
    from matplotlib.patches import Patch

    handles = [Patch(facecolor="#3b7dd8", label=bars.get_label()), Patch(facecolor="#9bbbe8", label=bars32.get_label())]
    if noisy:
        handles.append(Patch(facecolor="white", edgecolor="#b00000", hatch="//", label="too noisy to rank"))
    ax_speed.legend(handles=handles, fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(handles),
                    borderaxespad=0.3, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_compile_results(out_dir: str | Path, rows: list[dict[str, Any]], *, env: dict, config: dict,
                          command: str, title: str) -> dict[str, Path]:
    """results.json + results.md (kiln.bench.results) and results.png; returns the paths written."""
    mark_reference_drift(rows)
    for row in rows:
        annotate(row)
    return write_result_files(out_dir, rows, env=env, config=config, command=command, title=title,
                              columns=COLUMNS, plot=plot)
