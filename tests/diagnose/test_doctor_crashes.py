"""kiln doctor on crashes caused by custom ops (tests/diagnose/corpus/custom_ops.py): the user's call,
what failed and why, torch's own advice kept, and a fix to paste."""

from __future__ import annotations

import pytest

from kiln.diagnose.crash import custom_op, torch_advice
from kiln.diagnose.doctor import run_doctor
from kiln.diagnose.target import load_target

from .conftest import CORPUS, statement_line

OPS = CORPUS / "custom_ops.py"


def test_missing_fake_implementation_gets_a_fix_with_the_ops_own_arguments(tmp_path):
    report = run_doctor(load_target(f"{OPS}:clamped"), stages=["eager"], out_dir=tmp_path, repro=False)
    first = report["first_failure"]
    assert first["status"] == "crash" and first["op"] == "kiln_corpus::soft_clamp"
    assert first["where"]["line"] == statement_line(OPS, "return soft_clamp(self.fc(x), 3.0)")
    assert "no fake implementation" in first["diagnosis"]
    assert '@torch.library.register_fake("kiln_corpus::soft_clamp")\ndef _(x, limit):\n    return torch.empty_like(x)' \
        in first["fix"]
    assert "torch.library.opcheck(torch.ops.kiln_corpus.soft_clamp.default" in first["fix"]
    assert any("register_fake" in line for line in first["torch_advice"])


@pytest.mark.parametrize("stage", ["aot_eager_decomp_partition_crossref", "inductor"])
def test_fake_with_wrong_strides_points_at_the_users_call(tmp_path, stage):
    report = run_doctor(load_target(f"{OPS}:gated"), stages=[stage], out_dir=tmp_path, repro=False)
    first = report["first_failure"]
    assert first["status"] == "crash" and first["op"] == "kiln_corpus::gated_gelu"
    # Not inductor's generated file, not `def forward`: the line that calls the op.
    assert first["where"]["file"] == str(OPS)
    assert first["where"]["line"] == statement_line(OPS, "h = gated_gelu(self.value(x), self.gate(x))")
    assert "fake implementation reports different strides than its real kernel" in first["diagnosis"]
    assert "torch.library.opcheck(torch.ops.kiln_corpus.gated_gelu.default" in first["fix"]
    if stage == "inductor":
        assert "strides (16, 1), the fake implementation said (1, 4)" in first["diagnosis"]
        assert any("torch.library.opcheck" in line for line in first["torch_advice"])  # torch's words kept
        assert first["crossref"]["status"] == "crash"  # confirmed by the fake-vs-real cross-check
        assert report["bisect"] is None and any("no bisection" in note for note in report["notes"])
    else:
        assert "fake tensors" in first["diagnosis"] and "real tensors" in first["diagnosis"]
        assert "stride" in first["diagnosis"].lower()


def test_custom_op_and_advice_readers():
    text = ("AssertionError: expected size 4==4, stride 16==1 at dim=0\nError in op: torch.ops.mylib.scale.default\n"
            "This error most often comes from a incorrect fake (aka meta) kernel for a custom op.\n"
            "Use torch.library.opcheck to test your custom op.")
    assert custom_op(text) == "mylib::scale"
    assert torch_advice(text) == ["This error most often comes from a incorrect fake (aka meta) kernel for a custom op.",
                                  "Use torch.library.opcheck to test your custom op."]
    assert custom_op("Error in op: torch.ops.aten.mm.default") is None  # torch's own ops are not the user's


def test_explain_gives_the_same_fix_for_an_op_without_fake_implementation():
    from kiln.diagnose.explain import explain_target

    report = explain_target(load_target(f"{OPS}:clamped"), vary=[])
    run = report["runs"][0]
    assert run["status"] == "error" and run["op"] == "kiln_corpus::soft_clamp"
    assert run["line"] == statement_line(OPS, "return soft_clamp(self.fc(x), 3.0)")
    assert '@torch.library.register_fake("kiln_corpus::soft_clamp")' in run["fix"]
