"""Showing `kiln bench llm` results: a rich table, results.json/results.md, a PNG chart."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kiln.bench.results import pyplot, rich_table, write_result_files

# Columns of results.md, in order (results.json rows carry more: variants, parity, bytes, ...).
COLUMNS = [
    "engine", "quant", "status", "ttft_ms", "prefill_ms", "prefill_tok_s", "prefill_tflops", "prefill_peak_frac",
    "decode_tok_s", "token_ms_p50", "token_ms_p90", "achieved_gbs", "roofline_frac", "decode_vs_hf",
    "prefill_vs_hf", "decode_vs_unquantized", "peak_mem_bytes", "weight_bytes", "quant_backend", "group_size",
    "drift_kl", "drift_top1", "drift_max_abs", "drift_mean_abs", "drift_ok", "ppl", "ppl_ratio", "warmup_s", "compile_s",
    "compiles", "greedy_match", "profile_ms_per_step", "profile_kernels_per_step", "profile_idle_frac",
    "profile_busy_bandwidth_frac", "profile", "reason",
]
# Each ceiling fraction beside its datasheet twin, and the whole-request rate peers are compared on.
COLUMNS.insert(COLUMNS.index("prefill_peak_frac") + 1, "prefill_spec_frac")
COLUMNS[COLUMNS.index("roofline_frac") + 1:COLUMNS.index("roofline_frac") + 1] = [
    "roofline_spec_frac", "request_tok_s", "request_vs_gpt_fast", "peer_commit"]


def row_label(row: dict[str, Any]) -> str:
    """engine, or engine[quant] for a quantized row."""
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
    if key.endswith(("_vs_hf", "_vs_unquantized", "_vs_gpt_fast")):
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
               "request_vs_gpt_fast": "vs gpt-fast"}
    table = rich_table(rows, title, shown, headers,  # escape: rich would read "[int8]" as markup
                       lambda key, row: escape(row_label(row)) if key == "label" else _cell(key, row.get(key)))
    notes = [f"{row_label(row)}: {extra}" for row in rows
             for extra in (row.get("reason"), row.get("note"), row.get("prefill_error"), row.get("profile_error"),
                           row.get("profile_verdict") and f"decode profile: {row['profile_verdict']}") if extra]
    return Group(table, *(Text(n, style="dim") for n in notes))


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    """Prefill and decode tokens/s per engine, decode against the bandwidth roofline, and memory."""
    plt = pyplot()
    if plt is None:
        return None
    labels = [row_label(r) for r in rows]
    y = list(range(len(rows)))
    fig, (ax_pre, ax_dec, ax_mem) = plt.subplots(1, 3, figsize=(14, max(2.5, 0.5 * len(rows) + 1.4)), sharey=True)
    ax_pre.barh(y, [r.get("prefill_tok_s") or 0 for r in rows], color="#3b7dd8")
    ax_pre.set_xlabel("prefill tokens/s")
    ax_dec.barh(y, [r.get("decode_tok_s") or 0 for r in rows], color="#2a9d5c")
    roofs = [(i, r["roofline_tok_s"]) for i, r in enumerate(rows) if r.get("roofline_tok_s")]
    for i, roof in roofs:  # each row's own: a quantized row reads fewer bytes per token
        ax_dec.plot([roof, roof], [i - 0.4, i + 0.4], color="black", linestyle="--", linewidth=1)
    if roofs:
        ax_dec.text(roofs[-1][1], len(rows) - 0.5, " bandwidth roofline", fontsize=7, va="top")
    ax_dec.set_xlabel("decode tokens/s")
    mem = [(r.get("peak_mem_bytes") or 0) / 2**30 for r in rows]
    ax_mem.barh(y, mem, color="#d88a3b")
    ax_mem.set_xlabel("peak memory, GiB")
    if not any(mem):
        ax_mem.set_xticks([])
        ax_mem.text(0.5, 0.5, "not measured (CUDA only)", ha="center", va="center", transform=ax_mem.transAxes)
    for i, row in enumerate(rows):
        if row["status"] != "ok":
            ax_pre.text(0, i, f" {row['status']}", va="center", fontsize=8, color="#b00000")
    ax_pre.set_yticks(y)
    ax_pre.set_yticklabels(labels, fontsize=9)
    ax_pre.invert_yaxis()
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
