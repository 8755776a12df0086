"""The seed's examples: the four-break model and the all_reduce-in-forward model."""

from __future__ import annotations

from kiln.diagnose import break_kinds as classify
from kiln.diagnose.explain import explain_target
from kiln.diagnose.target import load_target

from .conftest import EXAMPLES, statement_line

SEED_BREAKS = EXAMPLES / "seed_graph_breaks.py"
SEED_ALL_REDUCE = EXAMPLES / "seed_all_reduce.py"


def test_four_break_model_lists_real_breaks_and_explains_the_rest():
    report = explain_target(load_target(f"{SEED_BREAKS}:build"), vary=[])
    rows = {row["construct"]: row for row in report["seed_expectations"]}
    assert len(rows) == 4
    item_line = statement_line(SEED_BREAKS, 'self.d["fc1-out"]')
    print_line = statement_line(SEED_BREAKS, "print(x)")
    by_line = {b["line"]: b for b in report["breaks"] if b["file"] == str(SEED_BREAKS)}
    # .item() and print break on every torch kiln supports (capture_scalar_outputs is off by default).
    assert by_line[item_line]["category"] == classify.SCALAR_OUTPUT
    assert by_line[print_line]["category"] == classify.PRINT_LOGGING
    assert rows[".item() into a Python dict"]["observed_break"] and rows["print of a tensor"]["observed_break"]
    # Every break the installed torch really has is listed; each seed construct has a verdict and a reason.
    assert report["graph_break_count"] == len(report["breaks"]) >= 2
    for row in rows.values():
        assert row["observed_break"] in (True, False) and row["note"]
        if row["expected_break"] and not row["observed_break"]:
            assert row["note"].startswith("no break on torch") and row["traced_as"]
    assert_line = rows["assert on a tensor"]
    if not assert_line["observed_break"]:
        assert "torch._assert_async" in assert_line["traced_as"]
    numpy_loop = rows["loop over np.arange"]
    if not numpy_loop["observed_break"]:
        assert "torch._numpy" in numpy_loop["note"]
    assert report["graph_count"] == report["graph_break_count"] + 1
    assert len(report["ops_per_graph"]) == report["graph_count"]


def test_all_reduce_model_flags_the_collective():
    report = explain_target(load_target(f"{SEED_ALL_REDUCE}:build"), vary=[])
    line = statement_line(SEED_ALL_REDUCE, "torch.distributed.all_reduce(sum_vals)")
    flagged = [c for c in report["collectives"] if c.get("line") == line] + [
        b for b in report["breaks"] if b["line"] == line and b["category"] == classify.COLLECTIVE
    ]
    assert flagged, (report["collectives"], report["breaks"])
    assert any("gloo" in n for n in report["notes"])
    (row,) = report["seed_expectations"]
    assert row["expected_break"] and row["observed_break"] in (True, False) and row["note"]
