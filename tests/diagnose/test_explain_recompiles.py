"""Recompiles: a changing Python float and a changing shape, each with the failing guard and a fix."""

from __future__ import annotations

import torch

from kiln.diagnose import break_kinds as classify
from kiln.diagnose.explain import explain_target
from kiln.diagnose.target import load_target
from kiln.diagnose.vary import parse_vary

from .conftest import PLANTED, marker_line, target


def test_python_float_argument_recompiles_once_as_a_probe_not_a_problem():
    report = explain_target(load_target(target("float_arg")), vary=parse_vary(["scalars"]))
    assert report["recompiles"] == [] and report["clean"] is True
    (probe,) = report["probes"]
    assert probe["vary"] == "scalars" and probe["expected"] is True
    assert "one recompile, then a dynamic graph (expected)" in probe["verdict"]
    (rc,) = probe["recompiles"]
    assert rc["category"] == classify.PYTHON_SCALAR
    assert "scale" in rc["guard"] and "0.5" in rc["guard"]
    # torch 2.13 names the line that uses the value; older torch only the function (the def line above it).
    assert rc["file"] == str(PLANTED) and rc["line"] in (marker_line("float"), marker_line("float") - 1)
    assert "torch.tensor" in rc["hint"]
    assert rc["source"] == "--vary scalars=(1.0)"
    assert report["breaks"] == []  # a recompile is not a graph break


def test_clean_model_has_no_problems_and_the_provoked_recompile_is_expected():
    report = explain_target(load_target(target("clean")))  # default --vary batch,scalars
    assert report["recompiles"] == [] and report["breaks"] == [] and report["clean"] is True
    (probe,) = report["probes"]  # the model takes no Python numbers: only the batch probe ran
    assert probe["vary"] == "batch" and probe["variants"] == ["batch=8", "batch=12"] and probe["expected"]
    assert probe["verdict"] == "if your batch size changes: one recompile, then a dynamic graph (expected)"
    assert [r["category"] for r in probe["recompiles"]] == [classify.SHAPE_CHANGE]
    assert "size mismatch at index 0" in probe["recompiles"][0]["guard"]
    assert [run["label"] for run in report["runs"]] == ["example", "example again", "batch=8", "batch=12"]


def test_a_value_that_recompiles_every_time_is_a_problem():
    report = explain_target(load_target(target("repeated")), vary=parse_vary(["scalars"]))
    assert report["clean"] is False
    (probe,) = report["probes"]
    assert probe["expected"] is False and "every new value recompiles" in probe["verdict"]
    (problem,) = report["recompiles"]  # the first change is expected; the second one is the problem
    assert problem["source"] == "--vary scalars=(4)"
    assert "times" in problem["guard"]


def test_input_sets_from_a_file_are_called_in_order(tmp_path):
    sets = [(torch.randn(4, 8),), (torch.randn(6, 8),)]
    path = tmp_path / "inputs.pt"
    torch.save(sets, path)
    t = load_target(target("clean"), inputs_from=str(path))
    assert t.input_source == "--inputs-from" and len(t.input_sets) == 2
    report = explain_target(t)  # several input sets: no extra variation by default
    assert [run["label"] for run in report["runs"]] == ["example", "example again", "input set 1"]
    assert [r["category"] for r in report["recompiles"]] == [classify.SHAPE_CHANGE]


def test_guard_classifier():
    assert classify.classify_guard("tensor 'x' dtype mismatch. expected Float, actual Double")[0] == classify.DTYPE_CHANGE
    assert classify.classify_guard("GLOBAL_STATE changed: grad_mode ")[0] == classify.GLOBAL_STATE
    assert classify.classify_guard("L['scale'] == 0.5")[0] == classify.PYTHON_SCALAR
    assert classify.classify_guard("___check_obj_id(L['self'], 1234)")[0] == classify.OBJECT_IDENTITY
