"""explain runs the model as the user does: the module's own mode (training: forward and backward with
autograd on), any Python value as an input, and a fullgraph verdict that agrees with the breaks listed."""

from __future__ import annotations

import json

import pytest
import torch

from kiln.cli.main import main
from kiln.diagnose import break_kinds as classify
from kiln.diagnose.explain import explain_target
from kiln.diagnose.inputs import load_input_sets
from kiln.diagnose.target import load_target
from kiln.errors import ConfigError

from .conftest import CORPUS, statement_line

GRADS = CORPUS / "clipped_grads.py"
TASKS = CORPUS / "task_heads.py"


def test_a_training_mode_module_runs_backward_so_a_break_in_backward_shows():
    report = explain_target(load_target(f"{GRADS}:build"), vary=[])
    assert report["train"] is True and report["autograd"] is True and "training mode" in report["mode"]
    line = statement_line(GRADS, "peak = grad.abs().max().item()")
    (brk,) = [b for b in report["breaks"] if b["line"] == line]
    assert brk["category"] == classify.SCALAR_OUTPUT
    assert report["fullgraph_ok"] is False and report["fullgraph_blocker"]["line"] == line


def test_an_eval_mode_module_runs_forward_only_and_the_backward_break_is_not_its_problem():
    report = explain_target(load_target(f"{GRADS}:build_eval"), vary=[])
    assert report["train"] is False and report["autograd"] is False and "eval mode" in report["mode"]
    assert report["breaks"] == [] and report["fullgraph_ok"] is True


def test_no_train_forces_forward_without_autograd(capsys):
    assert main(["explain", f"{GRADS}:build", "--no-vary", "--no-train", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["breaks"] == [] and report["backend"] == "eager" and report["mode"].startswith("--no-train")


def test_a_gradient_hook_registered_in_forward_is_found_at_its_line():
    path = CORPUS / "clipped_grads.py"
    report = explain_target(load_target(f"{path}:hooked"), vary=[])
    line = statement_line(path, "h.register_hook(")
    assert [(b["line"], b["category"]) for b in report["breaks"]] == [(line, classify.PRINT_LOGGING)]


@pytest.mark.parametrize("train_flag", [[], ["--train"]])
def test_the_header_verdict_agrees_with_the_breaks_listed(train_flag, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["explain", f"{GRADS}:build", "--no-vary", *train_flag, "--json", str(out)]) == 0
    shown = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["breaks"] and report["fullgraph_ok"] is False
    assert "fullgraph=True: works" not in shown


def test_factory_inputs_may_be_strings_dicts_and_dataclasses():
    t = load_target(f"{TASKS}:build")
    assert t.input_source == "factory" and t.inputs[1] == "classify" and "bias" in t.inputs[2]
    report = explain_target(t, vary=[])
    assert report["runs"][0]["status"] == "ok" and report["clean"] is True
    assert report["inputs"][1] == "str='classify'" and report["inputs"][3].startswith("HeadOptions=")


def test_inputs_from_a_python_function_calls_in_order_and_names_the_string_guard():
    report = explain_target(load_target(f"{TASKS}:build", inputs_from=f"{TASKS}:calls"))
    assert report["input_source"] == "--inputs-from"
    (rc,) = report["recompiles"]
    assert rc["category"] == classify.STRING_VALUE and rc["guard"] == "task == 'classify'"
    assert rc["line"] == statement_line(TASKS, "out = self.heads[task](h)")
    assert "`task` is a string" in rc["hint"] and "make it a tensor" not in rc["hint"]


def test_inputs_from_pt_with_python_values(tmp_path):
    path = tmp_path / "calls.pt"
    torch.save([(torch.randn(4, 16), "regress", {"bias": torch.zeros(16)}, 0.5)], path)
    ((x, task, extra, scale),) = load_input_sets(str(path))
    assert task == "regress" and torch.equal(extra["bias"], torch.zeros(16)) and scale == 0.5


def test_inputs_from_pt_with_a_dataclass_points_at_the_python_form(tmp_path):
    from tests.diagnose.corpus.task_heads import HeadOptions

    path = tmp_path / "calls.pt"
    torch.save([(torch.randn(4, 16), "regress", {}, HeadOptions())], path)
    with pytest.raises(ConfigError) as err:
        load_target(f"{TASKS}:build", inputs_from=str(path))
    assert err.value.key == "--inputs-from" and "file.py:function" in str(err.value)
