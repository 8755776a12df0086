"""Recompiles blamed on the user's line that makes the guarded value, with hints that fit what torch
did (how often it recompiled, whether a dynamic size was pinned again, whether mark_dynamic works)."""

from __future__ import annotations

from kiln.diagnose import break_kinds as classify
from kiln.diagnose.explain import explain_target
from kiln.diagnose.target import load_target
from kiln.diagnose.vary import parse_vary

from .conftest import CORPUS, statement_line


def test_a_cache_keyed_by_sequence_length_is_blamed_on_the_lookup_not_the_def():
    path = CORPUS / "rotary_cache.py"
    report = explain_target(load_target(f"{path}:build"), vary=parse_vary(["dim1"]))
    (rc,) = report["recompiles"]  # the first change is automatic dynamic's; the second is the problem
    assert rc["category"] == classify.SIZE_SPECIALIZED and rc["source"] == "--vary dim1=48"
    assert (rc["file"], rc["line"]) == (str(path), statement_line(path, "if seq_len not in self._angles:"))
    assert "size mismatch at index 1" in rc["guard"] and rc["times"] == 2
    for word in ("dynamic after its first change", "a cache per size", "slice it", "2 recompiles"):
        assert word in rc["hint"], word
    assert "one recompile is expected" not in rc["hint"]
    # mark_dynamic raises on a size the code pins: kiln tried it, so it is not offered.
    assert rc["tried"]["fix"] == "torch._dynamo.mark_dynamic(x, 1)" and rc["tried"]["verified"] is False
    assert "Verified" not in rc["hint"]
    (probe,) = report["probes"]
    assert probe["expected"] is False and "every new value recompiles" in probe["verdict"]


def test_mark_dynamic_is_offered_verified_where_it_works():
    from kiln.diagnose.verify import shape_fix

    def forward(x, mask):
        return x

    fix = shape_fix("tensor 'L['mask']' size mismatch at index 1. expected 16, actual 32", forward)
    assert fix.text == "torch._dynamo.mark_dynamic(mask, 1)" and fix.mark == (1, 1)
    assert shape_fix("tensor 'y' size mismatch at index 0. expected 4, actual 8", forward) is None


def test_an_attribute_forward_writes_is_not_called_an_argument():
    path = CORPUS / "warmup_scale.py"
    report = explain_target(load_target(f"{path}:build"), vary=[])
    (rc,) = report["recompiles"]
    assert rc["category"] == classify.MODULE_ATTRIBUTE and rc["source"] == "your inputs"
    assert rc["line"] == statement_line(path, "self.calls += 1")
    assert "`self.calls` is a Python number kept on the module (not an argument)" in rc["hint"]
    assert "forward changes it on this line" in rc["hint"] and 'register_buffer("calls"' in rc["hint"]
    assert "argument changed" not in rc["hint"]
    # The flag that would make module ints dynamic was tried; here it does not help, so it is not offered.
    assert rc["tried"]["fix"] == "torch._dynamo.config.allow_unspec_int_on_nn_module = True"
    assert rc["tried"]["verified"] is False


def test_dict_keys_changing_get_a_container_fix_not_make_it_a_tensor():
    path = CORPUS / "feature_dict.py"
    report = explain_target(load_target(f"{path}:build", inputs_from=f"{path}:calls"))
    assert report["recompiles"]
    for rc in report["recompiles"]:
        assert rc["category"] == classify.CONTAINER_KEYS, rc["guard"]
        assert "`features` is a Python container" in rc["hint"] and "make it a tensor" not in rc["hint"]
        assert "tensor input" not in rc["hint"]


def test_a_value_that_recompiles_repeatedly_is_not_promised_to_become_dynamic():
    path = CORPUS / "distill.py"
    report = explain_target(load_target(f"{path}:build"), vary=[("scalars", None)])
    (rc,) = report["recompiles"]
    assert rc["category"] == classify.MATH_CONSTANT and rc["times"] == 2
    assert "dynamic shapes cannot help" in rc["hint"]


def test_guard_kinds_from_the_guard_and_the_line():
    assert classify.classify_guard("len(L['features']) != 1")[0] == classify.CONTAINER_KEYS
    assert classify.classify_guard("list(dict.keys(L['features']))[0] == 'audio'")[0] == classify.CONTAINER_KEYS
    assert classify.classify_guard("L['task'] == 'classify'")[0] == classify.STRING_VALUE
    category, hint = classify.classify_guard("L['self'].step == 3", "self.step += 1")
    assert category == classify.MODULE_ATTRIBUTE and "forward changes it on this line" in hint
    assert classify.classify_guard("L['self'].step == 3", "y = x * self.step")[0] == classify.MODULE_ATTRIBUTE
    assert "make it a tensor" not in classify.classify_guard("something odd")[1]


def test_hitting_the_recompile_limit_is_said_and_a_higher_limit_is_verified():
    path = CORPUS / "dataset_heads.py"
    report = explain_target(load_target(f"{path}:build", inputs_from=f"{path}:calls"))
    (hit,) = report["recompile_limit_hits"]
    assert hit["function"] == "forward" and hit["limit"] == "recompile_limit" and hit["value"] == 8
    assert len(report["recompiles"]) == 8
    rc = report["recompiles"][-1]
    assert rc["category"] == classify.STRING_VALUE
    assert rc["line"] == statement_line(path, "return self.heads[dataset](")
    assert "runs `forward` eagerly" in rc["hint"]
    assert rc["tried"]["verified"] is True and rc["tried"]["fix"].startswith("torch._dynamo.config.recompile_limit = ")
    assert "Verified: with `torch._dynamo.config.recompile_limit = " in rc["hint"]


def test_a_higher_limit_is_not_offered_for_a_value_that_changes_every_call():
    from kiln.diagnose.recompiles import mark_limit_hits

    rc = {"function": "forward", "category": classify.MODULE_ATTRIBUTE, "hint": "h."}
    mark_limit_hits([rc], [{"function": "forward", "limit": "recompile_limit", "value": 8}])
    assert "only delays that" in rc["hint"]
    from kiln.diagnose.verify import recompile_fix

    assert recompile_fix({**rc, "torch_guard": "L['self'].step == 3.5"}, lambda x: x, 12) is None
