"""Showing `kiln bench llm` results: a rich table, results.json/results.md, a PNG chart."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kiln.bench.ratios import ratio_flags
from kiln.bench.results import pyplot, rich_table, write_result_files

# Columns of results.md, in order (results.json rows carry more: variants, parity, bytes, ...).
COLUMNS = [
    "engine", "quant", "batch", "status", "ttft_ms", "prefill_ms", "prefill_tok_s", "prefill_tflops", "prefill_peak_frac",
    "decode_tok_s", "decode_tok_s_per_seq", "decode_step_ms", "step_vs_batch1", "greedy_match_batch1", "token_ms_p50", "token_ms_p90", "achieved_gbs", "roofline_frac", "decode_vs_hf",
    "prefill_vs_hf", "decode_vs_unquantized", "peak_mem_bytes", "weight_bytes", "kv_bytes_per_step", "quant_backend", "group_size",
    "drift_kl", "drift_top1", "drift_max_abs", "drift_mean_abs", "drift_ok", "ppl", "ppl_ratio", "warmup_s", "compile_s",
    "compiles", "greedy_match", "profile_ms_per_step", "profile_kernels_per_step", "profile_idle_frac",
    "profile_busy_bandwidth_frac", "profile", "prefill_profile_ms", "prefill_profile_gpu_busy_ms",
    "prefill_profile_idle_frac", "prefill_profile", "reason",
]
# Each ceiling fraction beside its datasheet twin, and the whole-request rate peers are compared on.
COLUMNS.insert(COLUMNS.index("prefill_peak_frac") + 1, "prefill_spec_frac")
COLUMNS[COLUMNS.index("roofline_frac") + 1:COLUMNS.index("roofline_frac") + 1] = [
    "roofline_spec_frac", "request_tok_s", "request_vs_gpt_fast", "peer_commit"]


def row_label(row: dict[str, Any]) -> str:
    """The row's own label (with its batch size in a run of several), else engine, or engine[quant]
    for a quantized row."""
    if row.get("label"):
        return row["label"]
    quant = row.get("quant") or "none"
    return row["engine"] if quant == "none" else f"{row['engine']}[{quant}]"


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "drift_top1":
        return f"{100 * value:.1f}%"
    if key == "drift_kl":
        return f"{value:.2e}"
    if key.endswith("_bytes"):
        return f"{value / 2**30:.2f} GiB"
    if key.endswith("_frac"):
        return f"{100 * value:.1f}%"
    if key.endswith(("_vs_hf", "_vs_unquantized", "_vs_gpt_fast", "_vs_batch1")):
        return f"{value:.2f}x"
    if key.endswith("_s") and not key.endswith("tok_s"):
        return f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:,.1f}" if math.isfinite(value) and abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def render_table(rows: list[dict[str, Any]], title: str):
    """A rich Table of the main figures, with each row's reason or note listed under it."""
    from rich.console import Group
    from rich.markup import escape
    from rich.text import Text

    quantized = any((row.get("quant") or "none") != "none" for row in rows)
    shown = ["label", "status", "ttft_ms", "prefill_tok_s", "prefill_peak_frac", "decode_tok_s", "token_ms_p50",
             "roofline_frac", "decode_vs_hf", "prefill_vs_hf", "peak_mem_bytes", "warmup_s", "compiles"]
    if quantized:
        shown[shown.index("peak_mem_bytes"):shown.index("peak_mem_bytes")] = [
            "decode_vs_unquantized", "weight_bytes", "drift_kl", "drift_top1"]
    if any(row.get("ppl") for row in rows):
        shown[shown.index("peak_mem_bytes"):shown.index("peak_mem_bytes")] = ["ppl", "ppl_ratio"]
    if len({row.get("batch") for row in rows}) > 1:  # several batch sizes: the step time and its growth
        shown[shown.index("token_ms_p50"):shown.index("token_ms_p50") + 1] = ["decode_step_ms", "step_vs_batch1"]
    if any(row.get("roofline_spec_frac") is not None for row in rows):
        shown.insert(shown.index("roofline_frac") + 1, "roofline_spec_frac")
    if any(row.get("peer_commit") for row in rows):  # peers count tokens/s over the whole request
        shown[shown.index("decode_vs_hf"):shown.index("decode_vs_hf")] = ["request_tok_s", "request_vs_gpt_fast"]
    headers = {"label": "engine", "ttft_ms": "TTFT ms", "prefill_tok_s": "prefill tok/s",
               "prefill_peak_frac": "of matmul peak", "decode_tok_s": "decode tok/s", "token_ms_p50": "ms/token p50",
               "roofline_frac": "of roofline", "decode_vs_hf": "decode vs HF", "prefill_vs_hf": "prefill vs HF",
               "decode_vs_unquantized": "vs unquantized", "weight_bytes": "weights", "drift_kl": "drift KL",
               "drift_top1": "top-1 agree", "ppl_ratio": "ppl ratio", "peak_mem_bytes": "peak mem",
               "warmup_s": "warm-up s", "roofline_spec_frac": "of datasheet BW", "request_tok_s": "request tok/s",
               "request_vs_gpt_fast": "vs gpt-fast", "decode_step_ms": "ms/step", "step_vs_batch1": "step vs b1"}
    table = rich_table(rows, title, shown, headers,  # escape: rich would read "[int8]" as markup
                       lambda key, row: escape(row_label(row)) if key == "label" else _cell(key, row.get(key)))
    notes = [f"{row_label(row)}: {extra}" for row in rows
             for extra in (row.get("reason"), row.get("note"), row.get("prefill_error"), row.get("profile_error"),
                           row.get("profile_verdict") and f"decode profile: {row['profile_verdict']}",
                           row.get("prefill_profile_error"),
                           row.get("prefill_profile_verdict") and f"prefill profile: {row['prefill_profile_verdict']}",
                           *ratio_flags(row)) if extra]
    return Group(table, *(Text(n, style="dim") for n in notes))


def _bars(ax, y: list[int], values: list[float], color: str, fmt) -> None:
    """Horizontal bars with each value written at its end (`fmt(value)`), none for a missing one."""
    ax.barh(y, [v or 0 for v in values], color=color)
    top = max([v or 0 for v in values], default=0) or 1.0
    for i, value in zip(y, values, strict=True):
        if value:
            ax.text(value, i, f" {fmt(value)}", va="center", fontsize=7)
    ax.set_xlim(0, top * 1.3)  # room for the labels


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    """One panel per measured figure, each on its own axis with its values written on the bars:
    prefill tokens/s, decode tokens/s, decode as a share of each row's bandwidth roofline (a
    separate panel: tens of tokens/s against a roofline of thousands would vanish on one axis),
    request tokens/s where a peer reports only that, and peak memory. A figure no row has (memory on a CPU, a roofline without a bandwidth) has
    no panel."""
    plt = pyplot()
    if plt is None:
        return None
    labels = [row_label(r) for r in rows]
    y = list(range(len(rows)))
    prefill = [r.get("prefill_tok_s") for r in rows]
    decode = [r.get("decode_tok_s") for r in rows]
    roof = [r["decode_tok_s"] / r["roofline_tok_s"] if r.get("decode_tok_s") and r.get("roofline_tok_s") else None
            for r in rows]
    mem = [(r["peak_mem_bytes"] / 2**30) if r.get("peak_mem_bytes") else None for r in rows]
    # A peer that reports only new tokens over the whole request (gpt-fast) has no prefill or decode
    # bar: that figure gets a panel of its own, with every row's value on the same basis.
    request = [r.get("request_tok_s") for r in rows]
    peer_only = any(v and not r.get("decode_tok_s") for r, v in zip(rows, request, strict=True))

    def roof_text(i: int) -> str:
        return f"{roof[i]:.1%} of {rows[i]['roofline_tok_s']:,.0f} tok/s"

    panels = [
        ("prefill tokens/s", prefill, "#3b7dd8", lambda v: f"{v:,.0f}"),
        ("decode tokens/s", decode, "#2a9d5c", lambda v: f"{v:,.1f}" if v < 100 else f"{v:,.0f}"),
        ("decode, share of the bandwidth roofline", roof, "#7a5bd0", None),
        ("request tokens/s (new tokens / whole request)", request if peer_only else [], "#4a9aa8",
         lambda v: f"{v:,.1f}" if v < 100 else f"{v:,.0f}"),
        ("peak memory, GiB", mem, "#d88a3b", lambda v: f"{v:.2f}"),
    ]
    panels = [p for p in panels if any(v for v in p[1])]
    if not panels:
        panels = [("decode tokens/s", decode, "#2a9d5c", lambda v: f"{v:,.1f}")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 2.5, max(2.5, 0.5 * len(rows) + 1.4)),
                             sharey=True, squeeze=False)
    axes = list(axes[0])
    for ax, (xlabel, values, color, fmt) in zip(axes, panels, strict=True):
        if fmt is None:  # the roofline share: the fraction and the roofline it is a fraction of
            ax.barh(y, [v or 0 for v in values], color=[("#b00000" if (v or 0) > 1 else color) for v in values])
            for i, value in enumerate(values):
                if value:  # above 1: faster than the bytes allow, a measurement problem (kiln.bench.ratios)
                    ax.text(value, i, f" {roof_text(i)}" + (" (above the ceiling?)" if value > 1 else ""),
                            va="center", fontsize=7)
            ax.set_xlim(0, max(1.0, max(v or 0 for v in values)) * 1.3)
            ax.axvline(1.0, color="black", linestyle="--", linewidth=0.8)
            ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:.0%}"))
        else:
            _bars(ax, y, values, color, fmt)
        ax.set_xlabel(xlabel)
    for i, row in enumerate(rows):
        if row["status"] != "ok":
            axes[0].text(0, i, f" {row['status']}", va="center", fontsize=8, color="#b00000")
    axes[0].set_yticks(y)
    axes[0].set_yticklabels(labels, fontsize=9)
    axes[0].invert_yaxis()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_llm_results(out_dir: str | Path, rows: list[dict[str, Any]], *, env: dict, config: dict, command: str,
                      title: str) -> dict[str, Path]:
    always = ("engine", "quant", "status")  # other columns only where some row has a value
    columns = [c for c in COLUMNS if c in always or any(r.get(c) is not None for r in rows)]
    return write_result_files(out_dir, rows, env=env, config=config, command=command, title=title,
                              columns=columns, plot=plot)
