"""Recompiles: a changing Python float and a changing shape, each with the failing guard and a fix."""

from __future__ import annotations

import torch

from kiln.diagnose import classify, explain_target, load_target
from kiln.diagnose.vary import parse_vary

from .conftest import PLANTED, marker_line, target


def test_python_float_argument_recompiles_with_its_guard():
    report = explain_target(load_target(target("float_arg")), vary=parse_vary(["scalars"]))
    scalar = [r for r in report["recompiles"] if r["category"] == classify.PYTHON_SCALAR]
    assert scalar, report["recompiles"]
    rc = scalar[0]
    assert "scale" in rc["guard"] and "0.5" in rc["guard"]
    # torch 2.13 names the line that uses the value; older torch only the function (the def line above it).
    assert rc["file"] == str(PLANTED) and rc["line"] in (marker_line("float"), marker_line("float") - 1)
    assert "torch.tensor" in rc["hint"]
    assert report["breaks"] == []  # a recompile is not a graph break


def test_changing_batch_size_recompiles_once_then_is_dynamic():
    report = explain_target(load_target(target("clean")), vary=parse_vary(["batch"]))
    shape = [r for r in report["recompiles"] if r["category"] == classify.SHAPE_CHANGE]
    assert len(shape) == 1, report["recompiles"]  # batch 8 recompiles (dim marked dynamic), batch 12 does not
    assert "size mismatch at index 0" in shape[0]["guard"]
    assert shape[0]["file"] == str(PLANTED)
    assert "mark_dynamic" in shape[0]["hint"]
    assert [run["label"] for run in report["runs"]] == ["example", "batch=8", "batch=12"]


def test_input_sets_from_a_file_are_called_in_order(tmp_path):
    sets = [(torch.randn(4, 8),), (torch.randn(6, 8),)]
    path = tmp_path / "inputs.pt"
    torch.save(sets, path)
    t = load_target(target("clean"), inputs_from=str(path))
    assert t.input_source == "--inputs-from" and len(t.input_sets) == 2
    report = explain_target(t)  # several input sets: no extra variation by default
    assert [run["label"] for run in report["runs"]] == ["example", "input set 1"]
    assert [r["category"] for r in report["recompiles"]] == [classify.SHAPE_CHANGE]


def test_guard_classifier():
    assert classify.classify_guard("tensor 'x' dtype mismatch. expected Float, actual Double")[0] == classify.DTYPE_CHANGE
    assert classify.classify_guard("GLOBAL_STATE changed: grad_mode ")[0] == classify.GLOBAL_STATE
    assert classify.classify_guard("L['scale'] == 0.5")[0] == classify.PYTHON_SCALAR
    assert classify.classify_guard("___check_obj_id(L['self'], 1234)")[0] == classify.OBJECT_IDENTITY
