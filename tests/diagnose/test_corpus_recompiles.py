"""The corpus of realistic models: each recompile kind is found at the user's line with the fix that
fits it (not "pass it as a tensor" for everything), and blamed on the right call."""

from __future__ import annotations

import torch

from kiln.diagnose import break_kinds as classify
from kiln.diagnose.compile_record import guard_place
from kiln.diagnose.explain import explain_target
from kiln.diagnose.target import load_target

from .conftest import CORPUS, statement_line


def _inputs_file(tmp_path, sets):
    path = tmp_path / "calls.pt"
    torch.save(sets, path)
    return str(path)


def test_list_attribute_growing_in_forward_recompiles_every_call_and_is_not_blamed_on_the_probe():
    path = CORPUS / "feature_memory.py"
    report = explain_target(load_target(f"{path}:build"))  # default probes: batch
    assert report["recompiles"], report
    assert all(rc["source"] == "your inputs" for rc in report["recompiles"])  # the same-input call shows it
    rc = report["recompiles"][0]
    assert rc["category"] == classify.LIST_LENGTH
    assert rc["line"] == statement_line(path, "self.batch_means.append(")
    for word in ("`self.batch_means`", "Return the values from forward", "register_buffer"):
        assert word in rc["hint"]
    (probe,) = report["probes"]
    assert probe["vary"] == "batch" and "not judged" in probe["verdict"] and probe["expected"]


def test_varying_number_of_args(tmp_path):
    path = CORPUS / "multiview.py"
    x = torch.randn(4, 32)
    report = explain_target(load_target(f"{path}:build", inputs_from=_inputs_file(tmp_path, [(x, x), (x, x, x)])))
    (rc,) = report["recompiles"]
    assert rc["category"] == classify.ARG_COUNT and rc["guard"] == "len(views) == 2"
    assert rc["line"] == statement_line(path, "embeddings = [self.backbone(v) for v in views]")
    assert "`*views`" in rc["hint"] and "Stack the inputs into one tensor" in rc["hint"]
    assert "torch.tensor(value)" not in rc["hint"]


def test_bool_flag_that_switches_modes(tmp_path):
    path = CORPUS / "dual_head.py"
    x = torch.randn(4, 32)
    report = explain_target(load_target(f"{path}:build", inputs_from=_inputs_file(tmp_path, [(x, False), (x, True)])))
    (rc,) = report["recompiles"]
    assert rc["category"] == classify.BOOL_FLAG
    assert rc["line"] == statement_line(path, "if return_embeddings:")
    assert "`return_embeddings`" in rc["hint"] and "one function per mode" in rc["hint"] and "torch.cond" in rc["hint"]


def test_value_through_math_is_a_constant_that_dynamic_cannot_help():
    path = CORPUS / "distill.py"
    report = explain_target(load_target(f"{path}:build"), vary=[("scalars", None)])
    (rc,) = report["recompiles"]
    assert rc["category"] == classify.MATH_CONSTANT and rc["source"].startswith("--vary scalars")
    # torch 2.13 gives this guard's line only as a comment after the guard, not as a stack.
    assert rc["line"] == statement_line(path, "return (z @ z.T) * math.exp(-log_temperature)")
    for word in ("`log_temperature`", "math.*", "dynamic shapes cannot help", "torch.exp"):
        assert word in rc["hint"]


def test_guard_line_from_the_comment_torch_writes_after_it():
    from tests.diagnose.corpus import distill

    code = distill.ContrastiveHead.forward.__code__
    line = statement_line(CORPUS / "distill.py", "z = F.normalize(")
    shortened = str(CORPUS / "distill.py")[-30:]  # torch cuts the path's head
    text = f"x == 2.0  # z = F.normalize(self.proj(x), dim=-1)  # {shortened}:{line} in forward (utils.py:1 in run)"
    place = guard_place(text, "", code)
    assert (place.file, place.line) == (code.co_filename, line) and place.code.startswith("z = F.normalize(")
    fallback = guard_place("x == 2.0", "", code)  # no stack, no comment: the function's first line
    assert fallback.line == code.co_firstlineno


def test_guard_classifier_new_kinds():
    assert classify.classify_guard("len(L['args']) == 3")[0] == classify.ARG_COUNT
    assert classify.classify_guard("len(L['self'].cache) == 1")[0] == classify.LIST_LENGTH
    assert classify.classify_guard("not L['self'].cache")[0] == classify.LIST_LENGTH
    assert classify.classify_guard("L['causal'] == True")[0] == classify.BOOL_FLAG
    assert classify.classify_guard("___check_obj_id(L['causal'], 9461)", "if causal:")[0] == classify.BOOL_FLAG
    assert classify.classify_guard("___check_obj_id(L['norm'], 9461)", "x = norm(x)")[0] == classify.OBJECT_IDENTITY
    assert classify.classify_guard("L['t'] == 0.5", "s = math.log(t)")[0] == classify.MATH_CONSTANT
    assert classify.classify_guard("L['t'] == 0.5", "s = t * 2")[0] == classify.PYTHON_SCALAR
    assert classify.classify_guard("___stack0 == 3")[0] == classify.CARRIED_VALUE
