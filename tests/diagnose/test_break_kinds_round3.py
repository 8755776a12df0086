"""Break kinds beyond the first rounds, each at the user's line with its fix; a mechanical fix is
offered only when kiln re-ran the model with it and the break went away."""

from __future__ import annotations

import pytest

from kiln.diagnose import break_kinds as classify
from kiln.diagnose.explain import explain_target
from kiln.diagnose.target import load_target

from .conftest import CORPUS, statement_line

CASES = [
    # (file:factory, the statement that breaks, category, words the fix must contain, verified fix or None)
    ("sequence_tagger.py:build", "h, _ = self.rnn(h)", classify.RECURRENT,
     ["`nn.GRU`", "Compile the parts around it", "runs eagerly on every call"], "torch._dynamo.config.allow_rnn = True"),
    ("expert_pick.py:ranked", "ranked = sorted(outs, key=lambda t: t.mean())", classify.PY_SORT,
     ["torch.argsort", "torch.stack(items)[order]"], None),
    ("expert_pick.py:best", "best = max(outs, key=lambda t: t.norm())", classify.PY_SORT, ["torch.argmax"], None),
    ("energy_forces.py:build", "(grad,) = torch.autograd.grad(", classify.AUTOGRAD_IN_FORWARD,
     ["torch.func.grad", "outside the compiled code"], "torch._dynamo.config.trace_autograd_ops = True"),
    ("seeded_noise.py:build", "noise = torch.randn(x.shape, generator=self.rng)", classify.TORCH_GENERATOR,
     ["torch.manual_seed", "pass it in"], None),
    ("score_weights.py:truncated", "keep = int((x > 0).sum().item())", classify.SCALAR_OUTPUT,
     ["0-d tensor"], "torch._dynamo.config.capture_scalar_outputs = True"),
]


@pytest.mark.parametrize(("spec", "statement", "category", "words", "verified"), CASES, ids=[c[0] for c in CASES])
def test_break_kind_line_fix_and_verified_hint(spec, statement, category, words, verified):
    file = CORPUS / spec.split(":")[0]
    report = explain_target(load_target(f"{CORPUS / spec}"), vary=[])
    line = statement_line(file, statement)
    (brk,) = [b for b in report["breaks"] if b["line"] == line]
    assert brk["category"] == category and brk["file"] == str(file)
    for word in words:
        assert word in brk["hint"], (word, brk["hint"])
    if verified:
        assert brk["tried"] == {"fix": verified, "verified": True, "result": brk["tried"]["result"]}
        assert f"Verified: with `{verified}` the break is gone" in brk["hint"]
    else:
        assert "tried" not in brk and "Verified" not in brk["hint"]
    assert report["fullgraph_ok"] is False


def test_a_config_flag_that_does_not_remove_the_break_is_not_offered():
    path = CORPUS / "score_weights.py"
    report = explain_target(load_target(f"{path}:mixed"), vary=[])
    (brk,) = report["breaks"]
    assert brk["category"] == classify.SCALAR_OUTPUT and brk["line"] == statement_line(path, "weights = self.mix.tolist()")
    assert brk["tried"]["verified"] is False and "stays" in brk["tried"]["result"]
    assert "Verified" not in brk["hint"] and "is no fix here" in brk["hint"]


def test_a_frame_torch_gave_up_on_is_named_with_its_cost():
    path = CORPUS / "sequence_tagger.py"
    report = explain_target(load_target(f"{path}:build"), vary=[])
    (frame,) = report["eager_frames"]
    first = statement_line(path, "def forward(self, tokens")
    assert (frame["function"], frame["first_line"], frame["break_line"]) == (
        "forward", first, statement_line(path, "h, _ = self.rnn(h)"))
    assert "runs eagerly on every call" in frame["cost"] and "not compiled" in frame["cost"]
    assert report["graph_count"] == 0


def test_unknown_break_quotes_torchs_own_words():
    reason = ("Some new break\n  Explanation: Dynamo cannot handle frobnicate.\n  Hint: Use torch.frob instead.\n"
              "  Hint: It may be possible to write Dynamo tracing rules for this code.\n")
    assert classify.classify_break(reason, "y = frobnicate(x)") == classify.OTHER
    hint = classify.break_hint(classify.OTHER, reason, "y = frobnicate(x)")
    assert hint.startswith("torch says: Dynamo cannot handle frobnicate. Use torch.frob instead.")
    assert "tracing rules" not in hint


def test_skipped_frame_wrapper_does_not_hide_the_real_reason():
    reason = ("Failed to handle graph break gracefully. Skipping the function and falling back to eager. Graph break "
              "encountered:\n\nAttempted to wrap RNN, GRU, or LSTM\n  Explanation: Dynamo does not support RNN.")
    assert classify.classify_break(reason, "out, _ = self.lstm(x)") == classify.RECURRENT
    assert classify.headline(reason) == "Attempted to wrap RNN, GRU, or LSTM"
