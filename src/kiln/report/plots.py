"""The report's charts, as PNG bytes (matplotlib, the `plot` extra, Agg backend: no display)."""

from __future__ import annotations

import io
import math
from typing import Any

from kiln.errors import ConfigError

MIB = 2**20


def pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("kiln report", "matplotlib is not installed: pip install 'kiln[plot]'") from None
    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    pyplot().close(fig)
    return buf.getvalue()


def _series(records: list[dict[str, Any]], key: str, scale: float = 1.0) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(r["step"])
            ys.append(v * scale)
    return xs, ys


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=10, color="#555555", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _axes(title: str, ylabel: str, size=(7.5, 3.2)):
    fig, ax = pyplot().subplots(figsize=size)
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def lines(records: list[dict[str, Any]], title: str, ylabel: str, keys: list[tuple[str, str]], *,
          scale: float = 1.0, empty: str = "not recorded in this run", styles: dict[str, str] | None = None) -> bytes:
    """One line per (key, label) that has data; a note where none has."""
    fig, ax = _axes(title, ylabel)
    drawn = 0
    for key, label in keys:
        xs, ys = _series(records, key, scale)
        if xs:
            ax.plot(xs, ys, (styles or {}).get(key, ".-"), label=label, markersize=4)
            drawn += 1
    if drawn:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # never over a line
    else:
        _note(ax, empty)
    return _png(fig)


def gpu_health(records: list[dict[str, Any]], empty: str) -> bytes:
    """Utilisation, temperature, power and SM clock per log interval (mean and range)."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(9, 5.2), sharex=True)
    panels = [
        ("gpu_util_pct", "gpu_util_pct_min", "gpu_util_pct_max", None, "utilisation, %"),
        ("gpu_temp_c", None, None, None, "temperature (max), °C"),
        ("gpu_power_w", None, "gpu_power_w_max", "gpu_power_limit_w", "power (mean, max), W"),
        ("gpu_sm_clock_mhz", "gpu_sm_clock_mhz_min", None, "gpu_sm_clock_max_mhz", "SM clock (mean, min), MHz"),
    ]
    if not _series(records, "gpu_util_pct")[0] and not _series(records, "gpu_temp_c")[0]:
        plt.close(fig)
        return lines(records, "GPU health", "", [], empty=empty)
    for ax, (key, low, high, limit, label) in zip(axes.flat, panels):
        xs, ys = _series(records, key)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
        if not xs:
            _note(ax, "not reported by this GPU")
            continue
        ax.plot(xs, ys, ".-", markersize=4, color="#3b7dd8")
        lo, hi = _series(records, low)[1] if low else None, _series(records, high)[1] if high else None
        if lo and len(lo) == len(xs) and hi and len(hi) == len(xs):
            ax.fill_between(xs, lo, hi, alpha=0.2, color="#3b7dd8", label="min-max")
        elif hi and len(hi) == len(xs):
            ax.plot(xs, hi, ":", color="#3b7dd8", label="max")
        elif lo and len(lo) == len(xs):
            ax.plot(xs, lo, ":", color="#3b7dd8", label="min")
        if limit:
            _, ly = _series(records, limit)
            if ly:
                ax.axhline(ly[-1], color="#b00000", linestyle="--", linewidth=0.8,
                           label="max clock" if "clock" in limit else "limit")
        throttled = [r["step"] for r in records if (r.get("gpu_throttle_frac") or 0) > 0]
        for step in throttled:
            ax.axvline(step, color="#d88a3b", alpha=0.4, linewidth=2)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.suptitle("GPU health per log interval (orange bands: clocks throttled)", fontsize=11)
    return _png(fig)


def per_rank(records: list[dict[str, Any]]) -> bytes:
    """Per-rank step time, own time and time blocked in collectives; stragglers marked."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), sharex=True)
    steady = [r for r in records if not r.get("first_step")]  # step 1 compiles: seconds against ms
    for ax, (key, label) in zip(axes, (("step_ms_ranks", "step ms (wall)"), ("own_ms_ranks", "own ms (step - waits)"),
                                       ("sync_wait_ms_ranks", "blocked in collectives, ms"))):
        steps = [r["step"] for r in steady if isinstance(r.get(key), list)]
        values = [r[key] for r in steady if isinstance(r.get(key), list)]
        flat = sorted(x for v in values for x in v if x is not None)
        if len(flat) >= 4 and flat[-1] > 3 * flat[len(flat) // 2]:  # a recompile's spike: keep the rest readable
            ax.set_ylim(0, 1.5 * flat[int(0.9 * (len(flat) - 1))])
            ax.annotate(f"max {flat[-1]:,.1f} (off the scale)", xy=(0.98, 0.95), xycoords="axes fraction",
                        ha="right", fontsize=7, color="#b00000")
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        for rank in range(max((len(v) for v in values), default=0)):
            ax.plot(steps, [v[rank] if rank < len(v) and v[rank] is not None else math.nan for v in values],
                    ".-", markersize=3, label=f"rank {rank}")
        for r in records:
            if r.get("stragglers"):
                ax.axvline(r["step"], color="#b00000", alpha=0.15, linewidth=3)
        if values:
            ax.legend(fontsize=7)
    fig.suptitle("Per-rank timing (red: a straggler is named; step 1, with compilation, left out)", fontsize=11)
    return _png(fig)


def bars(labels: list[str], values: list[float | None], title: str, xlabel: str, notes: list[str] | None = None,
         ref: float | None = None) -> bytes:
    """Horizontal bars, one per row; rows without a value carry their note (e.g. the status)."""
    plt = pyplot()
    height = max(2.4, 0.36 * len(labels) + 1.3)
    fig, ax = plt.subplots(figsize=(9, height))
    ys = list(range(len(labels)))
    ax.barh(ys, [v if v is not None else 0.0 for v in values], color="#3b7dd8", height=0.6)
    for y, v, note in zip(ys, values, notes or [""] * len(labels)):
        text = (f" {v:,.0f}" if v is not None and abs(v) >= 1e4 else f" {v:.4g}") if v is not None else f" {note or 'n/a'}"
        ax.text(v if v is not None else 0.0, y, text, va="center", fontsize=8,
                color="#222222" if v is not None else "#b00000")
    if ref is not None:
        ax.axvline(ref, color="black", linewidth=0.8)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=11)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def series_by_group(groups: dict[str, list[tuple[float, float]]], title: str, xlabel: str, ylabel: str) -> bytes:
    """Lines of y over x, one per group (e.g. scaling efficiency over world size per strategy)."""
    fig, ax = pyplot().subplots(figsize=(7.5, 3.6))
    for name, points in groups.items():
        points = sorted(points)
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=name)
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)
