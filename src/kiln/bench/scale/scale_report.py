"""Showing scaling results: results.json + results.md (one table per row kind), a PNG, the console table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.bench.results import write_results

POINT_COLUMNS = [
    "variant", "strategy", "world", "role", "batch_per_rank", "status", "step_ms", "throughput",
    "throughput_per_device", "efficiency", "efficiency_base", "efficiency_vs_1rank", "compute_ms", "wrapper_ms", "exposed_comm_ms",
    "peak_mem_bytes", "mem_vs_single", "straggler_ratio", "mfu", "threshold", "pass", "reason",
]
COMM_COLUMNS = ["op", "bytes", "world", "used_by", "status", "time_us", "algbw_GBps", "busbw_GBps", "reason"]
FIT_COLUMNS = ["kind", "op", "world", "latency_us", "busbw_GBps", "fit_max_rel_err", "points", "overlap_cost",
               "compute_us", "comm_us", "both_us"]
PREDICTION_COLUMNS = [
    "variant", "strategy", "world", "nodes", "status", "step_ms", "compute_ms", "comm_ms", "exposed_comm_ms",
    "overlap_cost_ms", "throughput_per_device", "efficiency", "measured_efficiency", "error_points", "threshold",
    "pass", "algorithm", "t1_source", "reason",
]
ALL_COLUMNS = list(dict.fromkeys(["kind", *POINT_COLUMNS, *COMM_COLUMNS, *FIT_COLUMNS, *PREDICTION_COLUMNS]))

NOTES = """Efficiency: throughput per device over the one-process baseline's (`none`, 1 rank, no wrapper), or,
when the rank counts start above 1, over the variant's own smallest point (`efficiency_base`);
`efficiency_vs_1rank` uses the variant's own 1-rank point instead. `compute_ms` is the variant's step at
one rank with the same per-rank batch (no peers, so no communication); `exposed_comm_ms` = step_ms -
compute_ms; `wrapper_ms` = compute_ms - the baseline's step. Bus bandwidth as nccl-tests defines it
(all-reduce: algbw * 2(n-1)/n; all-gather and reduce-scatter: algbw * (n-1)/n). Predictions:
kiln.bench.scale.predict (alpha-beta collectives on a ring or tree, a two-stream schedule of buckets or FSDP
units, and the measured overlap cost); `t1_source` says where each prediction's 1-rank step came from."""


def sections(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict], list[str]]]:
    kind = lambda *k: [r for r in rows if r.get("kind") in k]  # noqa: E731
    return [
        ("Measured points", kind("point"), POINT_COLUMNS),
        ("Collectives at the model's sizes", kind("comm"), COMM_COLUMNS),
        ("Latency/bandwidth fit and overlap probe", kind("comm_fit", "overlap"), FIT_COLUMNS),
        ("Predictions", kind("prediction"), PREDICTION_COLUMNS),
    ]


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    """Left: efficiency vs ranks (measured markers, predicted lines, threshold steps). Right: each
    measured point's step split into baseline compute, wrapper cost and exposed communication."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    points = [r for r in rows if r.get("kind") == "point" and r["status"] == "ok" and r.get("role") == "point"]
    preds = [r for r in rows if r.get("kind") == "prediction" and r["status"] == "ok"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8))
    colors: dict[str, str] = {}
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for r in points + preds:
        colors.setdefault(r["variant"], palette[len(colors) % len(palette)])
    for variant, color in colors.items():
        mine = sorted((r for r in preds if r["variant"] == variant), key=lambda r: r["world"])
        if mine:
            ax.plot([r["world"] for r in mine], [r["efficiency"] for r in mine], "--", color=color,
                    label=f"{variant} predicted")
        got = sorted((r for r in points if r["variant"] == variant and r.get("efficiency") is not None),
                     key=lambda r: r["world"])
        if got:
            ax.plot([r["world"] for r in got], [r["efficiency"] for r in got], "o-", color=color,
                    label=f"{variant} measured")
    bars = sorted({(r["world"], r["threshold"]) for r in points + preds if r.get("threshold") is not None})
    if bars:
        ax.step([w for w, _ in bars], [t for _, t in bars], where="post", color="grey", linewidth=1, label="threshold")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks (GPUs)")
    ax.set_ylabel("efficiency (per-device throughput / the baseline's)")
    ax.set_ylim(0, 1.1)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, ncol=2 if len(colors) > 3 else 1)
    base = next((r for r in rows if r.get("kind") == "point" and r.get("role") == "baseline" and r["status"] == "ok"),
                None)
    shown = [r for r in points if r.get("compute_ms") is not None]
    if base is not None and shown:
        labels = [f"{r['variant']} x{r['world']}" for r in shown]
        stacks = [("baseline compute (none, 1 rank)", "#9bbbe8", [base["step_ms"] for _ in shown]),
                  ("wrapper at 1 rank", "#d88a3b", [max(0.0, r.get("wrapper_ms") or 0.0) for r in shown]),
                  ("exposed communication", "#b03a3a", [max(0.0, r.get("exposed_comm_ms") or 0.0) for r in shown])]
        bx.set_title("measured step", fontsize=9)
    elif preds:  # nothing measured to split: the predicted steps instead
        shown = sorted(preds, key=lambda r: (r["variant"], r["world"]))
        labels = [f"{r['variant']} x{r['world']}" for r in shown]
        stacks = [("1-rank step", "#9bbbe8", [r["compute_ms"] for r in shown]),
                  ("exposed communication", "#b03a3a", [r["exposed_comm_ms"] for r in shown]),
                  ("overlap cost", "#e0a0a0", [r["overlap_cost_ms"] for r in shown])]
        bx.set_title("predicted step", fontsize=9)
    else:
        stacks = []
    if stacks:
        x = list(range(len(labels)))
        bottom = [0.0] * len(x)
        for label, color, values in stacks:
            bx.bar(x, values, bottom=bottom, color=color, label=label)
            bottom = [b + v for b, v in zip(bottom, values)]
        bx.set_xticks(x)
        bx.set_xticklabels(labels, fontsize=6, rotation=60, ha="right")
        bx.set_ylabel("step ms")
        bx.legend(fontsize=7)
    else:  # no step to split: no empty half, the efficiency panel alone
        bx.remove()
        ax.set_subplotspec(ax.get_gridspec()[0, :])
        fig.set_size_inches(7.5, 4.8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_scale_results(out_dir: str | Path, rows: list[dict[str, Any]], *, env: dict, config: dict, command: str,
                        title: str, png: bool = True) -> dict[str, Path]:
    out = Path(out_dir)
    scaling = any(r.get("kind") in ("point", "prediction") for r in rows)
    written = {"json": write_results(out, env=env, config=config, results=rows, columns=ALL_COLUMNS, title=title,
                                     command=command, sections=sections(rows), notes=NOTES if scaling else "")}
    written["md"] = out / "results.md"
    if png:
        image = plot(rows, out / "results.png", title)
        if image is not None:
            written["png"] = image
    return written


def render_table(rows: list[dict[str, Any]], title: str):
    """The measured points and the predictions at the requested world sizes, for the console."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for name in ("kind", "variant", "ranks", "status", "step ms", "per-device /s", "efficiency", "compute ms",
                 "exposed comm ms", "peak mem", "bar", "note"):
        table.add_column(name, overflow="fold")

    def f(v, spec):
        return "-" if v is None else format(v, spec)

    for r in rows:
        if r.get("kind") not in ("point", "prediction"):
            continue
        passed = {True: "[green]pass[/green]", False: "[red]FAIL[/red]"}.get(r.get("pass"), "")
        bar = f"{r['threshold']:.0%} {passed}" if r.get("threshold") is not None else ""
        note = r.get("reason") or ""
        if r.get("error_points") is not None:
            note = f"measured {r['measured_efficiency']:.3f}, error {r['error_points']:+.1f} pts"
        mem = r.get("peak_mem_bytes")
        table.add_row(
            "measured" if r["kind"] == "point" else "predicted", r["variant"], str(r["world"]), r["status"],
            f(r.get("step_ms"), ".2f"), f(r.get("throughput_per_device"), ".4g"), f(r.get("efficiency"), ".3f"),
            f(r.get("compute_ms"), ".2f"), f(r.get("exposed_comm_ms"), ".2f"),
            "-" if mem is None else f"{mem / 2**20:.0f} MiB", bar, note[:160])
    return table
