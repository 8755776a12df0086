"""How far a timed ratio can be trusted, and the times it is recomputed from.

Every speedup kiln prints is a ratio of two medians timed interleaved (kiln.timing). A
ratio is shown next to the reference time it divides, so that a reader can recompute it from the
table; and it is flagged instead of ranked when the samples behind it scatter too widely (a
loaded machine, thermal throttling, another tenant), or when a figure exceeds a physical
ceiling (a fraction of the matmul peak above 1 is a measurement problem, not a fast kernel).

The rules here are pure functions of row fields, so the table, the plot, the markdown report,
`kiln advise` and `kiln autotune` all apply the same ones.
"""

from __future__ import annotations

from typing import Any

NOISY_SPREAD = 0.30
"""A side whose p10-p90 range is wider than this share of its median is too noisy to rank: a
ratio of two such medians can move by more than the gains being compared from one run to the
next. Quiet GPUs and CPUs stay well inside it (the h100 results README has the spreads)."""

DRIFT_LIMIT = 0.25
"""Two measurements of the same thing (an eager reference timed beside two rows, or one recipe
timed in two rounds) that differ by more than this share disagree: ratios between them are
not comparable. (A launch-bound eager reference on a GPU moves between rows by nearly this much.)"""


def spread(median: float | None, p10: float | None, p90: float | None) -> float | None:
    """(p90 - p10) / median: the relative width of the middle 80 % of the samples."""
    if median is None or p10 is None or p90 is None or median <= 0:
        return None
    return (p90 - p10) / median


def drift(a: float | None, b: float | None) -> float | None:
    """|a - b| / min(a, b): how far apart two measurements of the same thing are (0.25 = 25 %)."""
    if not a or not b or a <= 0 or b <= 0:
        return None
    return abs(a - b) / min(a, b)


CEILING_FRACTIONS = (
    ("peak_frac", "matmul peak"), ("spec_peak_frac", "datasheet matmul peak"),
    ("prefill_peak_frac", "matmul peak"), ("prefill_spec_frac", "datasheet matmul peak"),
    ("roofline_frac", "measured read bandwidth"), ("roofline_copy_frac", "measured copy bandwidth"),
    ("roofline_spec_frac", "datasheet bandwidth"),
)


def ratio_flags(row: dict[str, Any]) -> list[str]:
    """Why a row's ratios must not be read as a ranking: its own or its eager reference's samples
    scatter more than NOISY_SPREAD, or a fraction of a ceiling is above 1. Empty for a sound row."""
    flags = []
    sides = [("step", row.get("step_ms"), row.get("step_ms_p10"), row.get("step_ms_p90"))]
    if row.get("mode") != "eager" or row.get("runner") == "plain":
        sides.append(("eager reference", row.get("eager_step_ms"), row.get("eager_step_ms_p10"),
                      row.get("eager_step_ms_p90")))
    for name, median, p10, p90 in sides:
        width = spread(median, p10, p90)
        if width is not None and width > NOISY_SPREAD:
            flags.append(f"noisy {name}: p10-p90 {p10:.4g}-{p90:.4g} ms is {width:.0%} of its median "
                         f"{median:.4g} ms (limit {NOISY_SPREAD:.0%}): too wide to rank, rerun on a quieter machine")
    moved = row.get("eager_drift")
    if isinstance(moved, (int, float)) and moved > DRIFT_LIMIT:
        flags.append(f"eager reference moved: timed beside this row at {row['eager_step_ms']:.4g} ms, "
                     f"{moved:.0%} from the eager row's {row['eager_row_ms']:.4g} ms (limit {DRIFT_LIMIT:.0%}): "
                     "this row's ratio is not comparable with the others'")
    # The ceiling fractions kiln's rows carry (compile rows: FLOP/s; llm rows: prefill FLOP/s and
    # decode bytes/s), each against a measured ceiling and against the datasheet.
    for key, ceiling in CEILING_FRACTIONS:
        value = row.get(key)
        if isinstance(value, (int, float)) and value > 1.0:
            flags.append(f"{value:.0%} of the {ceiling}: above the ceiling, so a measurement problem "
                         "(timing, FLOP count or the ceiling itself), not a result")
    return flags


def mark_reference_drift(rows: list[dict[str, Any]]) -> None:
    """Each row's ratio divides the eager run timed beside it; rows are comparable only while that
    reference holds still. Sets `eager_row_ms` (the eager row's own median at the row's precision)
    and `eager_drift` (how far the row's interleaved eager time is from it, `drift`) on every other
    row of that precision, in place; ratio_flags flags a drift above DRIFT_LIMIT."""
    baselines = {r.get("precision"): r.get("step_ms") for r in rows
                 if r.get("mode") == "eager" and r.get("runner", "kiln") == "kiln" and not r.get("cudagraphs")
                 and r.get("step_ms")}
    for row in rows:
        base = baselines.get(row.get("precision"))
        if base is None or row.get("step_ms") == base and row.get("mode") == "eager":
            continue
        moved = drift(row.get("eager_step_ms"), base)
        if moved is not None:
            row["eager_row_ms"], row["eager_drift"] = base, moved


def annotate(row: dict[str, Any]) -> dict[str, Any]:
    """Add `step_spread`, `eager_spread`, `noisy` (bool) and `flags` (text, None when sound) to a
    timed row, in place; returns the row. Rows without times get `noisy` False."""
    row["step_spread"] = spread(row.get("step_ms"), row.get("step_ms_p10"), row.get("step_ms_p90"))
    row["eager_spread"] = spread(row.get("eager_step_ms"), row.get("eager_step_ms_p10"), row.get("eager_step_ms_p90"))
    flags = ratio_flags(row)
    row["noisy"] = bool(flags)
    row["flags"] = "; ".join(flags) or None
    return row


def ratio_text(value: float | None, noisy: bool = False) -> str:
    """`1.52x`, or `~1.5x?` for a ratio whose samples are too noisy to rank ( - for none)."""
    if value is None:
        return "-"
    return f"~{value:.1f}x?" if noisy else f"{value:.2f}x"


def on_common_reference(base: dict[str, Any], row: dict[str, Any], ref: str = "eager_fp32_step_ms") -> dict[str, Any]:
    """The ratio of two rows timed at different moments, each interleaved with the same reference
    runner (eager fp32), with the two times it equals: `row`'s own median and `base`'s median
    rescaled to the reference as it was timed beside `row` (base_ms * row_ref / base_ref). So
    `before_ms / after_ms == ratio` exactly, and `drift` says how much the reference moved between
    the two measurements (above DRIFT_LIMIT the ratio is flagged `noisy`). When `base` is the
    reference run itself (its time is its reference), the ratio is read inside `row` alone and no
    drift applies.

    Returns {ratio, before_ms, after_ms, reference_ms, drift, noisy}; ratio None when a time is missing."""
    base_ms, after_ms = base.get("step_ms"), row.get("step_ms")
    base_ref, row_ref = base.get(ref), row.get(ref)
    out: dict[str, Any] = {"ratio": None, "before_ms": None, "after_ms": after_ms, "reference_ms": row_ref,
                           "drift": None, "noisy": bool(base.get("noisy") or row.get("noisy"))}
    if not base_ms or not after_ms or not base_ref or not row_ref:
        return out
    before_ms = base_ms * row_ref / base_ref
    moved = None if base_ms == base_ref else drift(base_ref, row_ref)
    out.update(ratio=before_ms / after_ms, before_ms=before_ms, drift=moved,
               noisy=out["noisy"] or (moved is not None and moved > DRIFT_LIMIT))
    return out


def gain_text(pair: dict[str, Any], before: str = "", after: str = "") -> str:
    """`1.52x (509 -> 335 ms/step)` from `on_common_reference`, the two times being the ones the
    ratio divides; a noisy pair reads `~1.5x? (...; too noisy to rank)`."""
    if pair.get("ratio") is None:
        return "not measured"
    b = f"{before} " if before else ""
    a = f"{after} " if after else ""
    text = (f"{ratio_text(pair['ratio'], pair['noisy'])} ({b}{pair['before_ms']:.3g} -> {a}{pair['after_ms']:.3g} "
            "ms/step")
    if pair.get("drift") is not None and pair["drift"] > 1e-9:
        text += f", on the eager fp32 reference timed beside the second, which moved {pair['drift']:.0%}"
    return text + ("; too noisy to rank)" if pair["noisy"] else ")")
