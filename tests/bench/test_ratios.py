"""The rules that make ratios readable: the reference beside each ratio, the noise flag, the
ceiling flag, two rows on a common reference (kiln.bench.ratios), and the table that shows them."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from kiln.bench import ratios
from kiln.bench.compile.compile_report import render_table


def _row(mode="default", ms=10.0, p10=9.5, p90=10.5, eager=20.0, ep10=19.0, ep90=21.0, precision="fp32", **kw):
    row = {"runner": "kiln", "precision": precision, "loss": "task", "mode": mode, "backend": "inductor",
           "scope": "model", "regional": False, "cudagraphs": False, "status": "ok", "reason": None,
           "step_ms": ms, "step_ms_p10": p10, "step_ms_p90": p90, "eager_step_ms": eager,
           "eager_step_ms_p10": ep10, "eager_step_ms_p90": ep90, "speedup": eager / ms,
           "eager_fp32_step_ms": eager, "speedup_vs_eager_fp32": eager / ms}
    row.update(kw)
    return row


def test_spread_and_drift_formulas():
    assert ratios.spread(10.0, 9.0, 12.0) == pytest.approx(0.3)
    assert ratios.spread(None, 1.0, 2.0) is None and ratios.spread(0.0, 1.0, 2.0) is None
    assert ratios.drift(100.0, 125.0) == pytest.approx(0.25)
    assert ratios.drift(125.0, 100.0) == pytest.approx(0.25)
    assert ratios.drift(None, 1.0) is None


def test_a_row_within_the_spread_limit_is_sound():
    row = ratios.annotate(_row(ms=10.0, p10=8.6, p90=11.4))  # 28 % wide
    assert row["noisy"] is False and row["flags"] is None
    assert row["step_spread"] == pytest.approx(0.28)


def test_the_reported_case_is_flagged_noisy_and_above_the_ceiling():
    row = ratios.annotate(_row(ms=47.9, p10=8.0, p90=685.0, peak_frac=1.28))
    assert row["noisy"] is True
    assert "p10-p90 8-685 ms" in row["flags"] and "1413% of its median" in row["flags"]
    assert "128% of the matmul peak: above the ceiling" in row["flags"]


def test_a_noisy_eager_reference_flags_the_compiled_row_but_an_eager_row_judges_its_own_samples():
    compiled = ratios.annotate(_row(eager=20.0, ep10=10.0, ep90=30.0))
    assert compiled["noisy"] and "noisy eager reference" in compiled["flags"]
    eager = ratios.annotate(_row(mode="eager", ms=20.0, p10=19.0, p90=21.0, eager=20.0, ep10=10.0, ep90=30.0))
    assert not eager["noisy"]


def test_ratio_text_is_confident_only_for_sound_rows():
    assert ratios.ratio_text(1.5234) == "1.52x"
    assert ratios.ratio_text(1.5234, noisy=True) == "~1.5x?"
    assert ratios.ratio_text(None) == "-"


def test_two_rows_on_a_common_reference_print_the_times_their_ratio_divides():
    """The advise case: fp32 eager read 1490 ms alone; bf16 335 ms beside an fp32 eager of 509 ms."""
    fp32 = {"step_ms": 1490.0, "eager_fp32_step_ms": 1490.0}
    bf16 = {"step_ms": 335.0, "eager_fp32_step_ms": 509.0}
    pair = ratios.on_common_reference(fp32, bf16)
    assert pair["before_ms"] == pytest.approx(509.0) and pair["after_ms"] == 335.0
    assert pair["ratio"] == pytest.approx(509.0 / 335.0)
    # The fp32 row is the reference itself: the ratio is read inside the bf16 row, no drift applies.
    assert pair["drift"] is None and pair["noisy"] is False
    text = ratios.gain_text(pair, "fp32", "bf16")
    assert text == "1.52x (fp32 509 -> bf16 335 ms/step)"
    before, after = map(float, re.search(r"fp32 ([\d.e+]+) -> bf16 ([\d.e+]+) ms/step", text).groups())
    assert f"{before / after:.2f}x" in text  # the printed times give the printed ratio


def test_a_reference_that_moved_between_two_rows_makes_their_ratio_noisy():
    pair = ratios.on_common_reference({"step_ms": 10.0, "eager_fp32_step_ms": 20.0},
                                      {"step_ms": 5.0, "eager_fp32_step_ms": 30.0})
    assert pair["before_ms"] == pytest.approx(15.0) and pair["ratio"] == pytest.approx(3.0)
    assert pair["drift"] == pytest.approx(0.5) and pair["noisy"] is True
    assert ratios.gain_text(pair) == ("~3.0x? (15 -> 5 ms/step, on the eager fp32 reference timed beside the "
                                      "second, which moved 50%; too noisy to rank)")


def test_a_steady_pair_reads_as_a_plain_ratio():
    pair = ratios.on_common_reference({"step_ms": 12.0, "eager_fp32_step_ms": 20.0},
                                      {"step_ms": 8.0, "eager_fp32_step_ms": 21.0})
    assert pair["ratio"] == pytest.approx(12.0 * 21.0 / 20.0 / 8.0) and not pair["noisy"]
    text = ratios.gain_text(pair)
    assert text.startswith(f"{pair['ratio']:.2f}x (12.6 -> 8 ms/step")
    assert ratios.gain_text(ratios.on_common_reference({}, {"step_ms": 1.0})) == "not measured"


def _table_text(rows, width):
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(render_table(rows, "kiln bench compile: test"))
    return console.export_text()


@pytest.mark.parametrize("width", [80, 120, 220])
def test_every_ratio_in_the_table_is_recomputable_from_the_times_beside_it(width):
    """The issue's case: eager 12.461 ms alone, the compiled row 10.971 ms beside an eager run of
    82.94 ms: the table prints the ratio next to 82.940, not next to 12.461 only, and, since that
    reference is 566 % off the eager row, marks it as not comparable instead of ranking it."""
    rows = [_row(mode="eager", ms=12.461, p10=12.3, p90=12.7, eager=12.461, ep10=12.3, ep90=12.7),
            _row(ms=10.971, p10=10.8, p90=11.2, eager=82.94, ep10=80.0, ep90=85.0)]
    text = _table_text(rows, width)
    flat = " ".join(text.split())
    assert "82.940" in flat and "10.971" in flat and "~7.6x?" in flat and "7.56x" not in flat
    assert f"{82.94 / 10.971:.1f}" == "7.6"
    assert "eager reference moved" in flat  # the reason, under the row
    assert "566% from the eager row's 12.46 ms" in rows[1]["flags"]


def test_a_row_whose_eager_reference_holds_still_ranks_and_one_that_moved_is_flagged():
    """The reference of each row against the eager row of its precision (DRIFT_LIMIT 25 %):
    20 % off still ranks, 30 % off is flagged; another precision's eager row is not a reference."""
    eager = _row(mode="eager", ms=10.0, p10=9.9, p90=10.1, eager=10.0, ep10=9.9, ep90=10.1)
    steady = _row(ms=5.0, p10=4.9, p90=5.1, eager=12.0, ep10=11.9, ep90=12.1)
    moved = _row(ms=5.0, p10=4.9, p90=5.1, eager=13.0, ep10=12.9, ep90=13.1, mode="reduce-overhead")
    other = _row(ms=5.0, p10=4.9, p90=5.1, eager=30.0, ep10=29.9, ep90=30.1, precision="bf16-mixed")
    rows = [eager, steady, moved, other]
    ratios.mark_reference_drift(rows)
    for row in rows:
        ratios.annotate(row)
    assert steady["eager_drift"] == pytest.approx(0.2) and not steady["noisy"]
    assert moved["eager_drift"] == pytest.approx(0.3) and moved["noisy"]
    assert "30% from the eager row's 10 ms" in moved["flags"]
    assert "eager_drift" not in other and not other["noisy"] and "eager_drift" not in eager


def test_a_noisy_row_reads_as_uncertain_with_the_reason_under_it():
    rows = [_row(mode="eager", ms=47.9, p10=8.0, p90=685.0, eager=47.9, ep10=8.0, ep90=685.0),
            _row(ms=20.0, p10=19.0, p90=21.0, eager=47.9, ep10=8.0, ep90=685.0)]
    flat = " ".join(_table_text(rows, 220).split())
    assert "~2.4x?" in flat and "2.40x" not in flat
    assert "too wide to rank" in flat


def test_an_eager_baseline_reads_1x_even_when_noisy():
    rows = [_row(mode="eager", ms=47.9, p10=8.0, p90=685.0, eager=47.9, ep10=8.0, ep90=685.0)]
    flat = " ".join(_table_text(rows, 220).split())
    assert "1.00x" in flat and "~1.0x?" not in flat and "too wide to rank" in flat


@pytest.mark.parametrize(("key", "ceiling"), [("roofline_frac", "measured read bandwidth"),
                                              ("roofline_spec_frac", "datasheet bandwidth"),
                                              ("spec_peak_frac", "datasheet matmul peak")])
def test_every_ceiling_fraction_a_row_carries_is_checked(key, ceiling):
    row = ratios.annotate(_row(ms=10.0, p10=9.9, p90=10.1, **{key: 1.05}))
    assert row["noisy"] and f"105% of the {ceiling}: above the ceiling" in row["flags"]
    assert not ratios.annotate(_row(ms=10.0, p10=9.9, p90=10.1, **{key: 0.95}))["noisy"]
