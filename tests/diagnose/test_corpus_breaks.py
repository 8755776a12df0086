"""The corpus of realistic models (tests/diagnose/corpus): each graph break kind is found at the user's
line, in the right category, with a fix that names what to write instead."""

from __future__ import annotations

import pytest

from kiln.diagnose import break_kinds as classify
from kiln.diagnose.explain import explain_target
from kiln.diagnose.target import load_target

from .conftest import CORPUS, statement_line

CASES = [
    # (file, the statement that breaks, category, words the fix must contain)
    ("checked_block.py", "h = h / activation_scale(h)", classify.DISABLED,
     ["`activation_scale`", "remove the decorator", "move the decorator", "no custom op"]),
    ("stochastic_depth.py", "if random.random() < self.drop_prob:", classify.PY_RANDOM,
     ["`random.random()`", "`torch.rand(())`", "torch.where"]),
    ("bucketed_positions.py", "ids = np.digitize(", classify.NUMPY,
     ["`np.digitize`", "torch.bucketize(x, bins, right=True)"]),
    ("noise_schedule.py", "sigma = next(self.noise_levels)", classify.GENERATOR,
     ["generator", "Precompute the values", "pass the value in"]),
    ("logged_encoder.py", "logger.info(", classify.PRINT_LOGGING, ["Move the print/log out of forward"]),
]


@pytest.mark.parametrize(("file", "statement", "category", "words"), CASES, ids=[c[0] for c in CASES])
def test_break_kind_has_its_line_category_and_fix(file, statement, category, words):
    path = CORPUS / file
    report = explain_target(load_target(f"{path}:build"))  # default probes (batch, scalars) included
    line = statement_line(path, statement)
    (brk,) = [b for b in report["breaks"] if b["category"] == category]
    assert (brk["file"], brk["line"]) == (str(path), line)
    for word in words:
        assert word in brk["hint"], (word, brk["hint"])
    # Once per forward, however many compiles kiln's probes and fullgraph check made.
    assert brk["count"] == 1
    assert report["fullgraph_ok"] is False and report["fullgraph_blocker"]["line"] == line


def test_logging_inside_the_standard_library_is_not_a_second_finding():
    path = CORPUS / "logged_encoder.py"
    report = explain_target(load_target(f"{path}:build"))
    assert [(b["line"], b["category"]) for b in report["breaks"]] == [
        (statement_line(path, "logger.info("), classify.PRINT_LOGGING)]
    assert report["graph_break_count"] == 1


def test_generator_value_guard_is_told_in_user_terms():
    path = CORPUS / "noise_schedule.py"
    report = explain_target(load_target(f"{path}:build"), vary=[])
    (rc,) = report["recompiles"]
    assert rc["category"] == classify.CARRIED_VALUE and rc["source"] == "your inputs"
    assert "___stack" not in rc["guard"]
    assert f"graph break at line {statement_line(path, 'sigma = next(self.noise_levels)')}" in rc["guard"]
    assert "next()" in rc["hint"] and "fix the graph break" in rc["hint"]


def test_classifier_reads_the_new_kinds_from_older_wordings():
    assert classify.classify_break("call_function UserFunctionVariable() skipped due to torch._dynamo.disable",
                                   "y = helper(x)") == classify.DISABLED
    assert classify.classify_break("Attempted to call function marked as skipped", "p = random.uniform(0, 1)") == (
        classify.PY_RANDOM)
    assert "torch.empty(()).uniform_(a, b)" in classify.break_hint(classify.PY_RANDOM, "", "p = random.uniform(0, 1)")
    assert classify.classify_break("unsupported", "s = next(self.it)") == classify.GENERATOR
    hint = classify.break_hint(classify.NUMPY, "", "q = np.percentile(a.numpy(), 90)")
    assert "torch.quantile(x, q / 100)" in hint
