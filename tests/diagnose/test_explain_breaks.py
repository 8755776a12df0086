"""Planted graph breaks, one per category: explain names each with the right file:line and category."""

from __future__ import annotations

import pytest

from kiln.diagnose import break_kinds as classify
from kiln.diagnose.explain import explain_target
from kiln.diagnose.target import load_target

from .conftest import PLANTED, marker_line, target

CASES = [
    ("branch", "branch", classify.DATA_DEPENDENT_BRANCH),
    ("item", "item", classify.SCALAR_OUTPUT),
    ("printer", "print", classify.PRINT_LOGGING),
    ("logging_call", "logging", classify.PRINT_LOGGING),
    ("builtin", "builtin", classify.UNSUPPORTED_CALL),
    ("numpy_call", "numpy", classify.NUMPY),
    ("collective", "collective", classify.COLLECTIVE),
    ("dynamic_shape", "dynamic", classify.DYNAMIC_SHAPE),
]


@pytest.mark.parametrize(("factory", "tag", "category"), CASES, ids=[c[0] for c in CASES])
def test_planted_break_is_named_with_place_and_category(factory, tag, category):
    report = explain_target(load_target(target(factory)), vary=[])
    line = marker_line(tag)
    hits = [b for b in report["breaks"] if b["file"] == str(PLANTED) and b["line"] == line]
    assert hits, f"no break at planted.py:{line}; got {[(b['line'], b['category']) for b in report['breaks']]}"
    brk = hits[0]
    assert brk["category"] == category
    assert f"# planted: {tag}" in brk["code"]
    assert classify.BREAK_HINTS[category] in brk["hint"]
    assert brk["reason"] and brk["explanation"]  # torch's own words are kept
    assert report["graph_break_count"] >= 1
    # Not one graph, since a break is listed; whether fullgraph=True itself compiles is torch's own
    # compile (recent torch captures `.item()` there) and is said beside the verdict.
    assert report["fullgraph_ok"] is False
    assert report["fullgraph_blocker"].get("fullgraph_compiles", False) == _fullgraph_compiles(factory)


def _fullgraph_compiles(factory: str) -> bool:
    import contextlib
    import io

    import torch

    from kiln.diagnose.call_target import single_process_group

    t = load_target(target(factory))
    torch.compiler.reset()
    with single_process_group(factory == "collective"), contextlib.redirect_stdout(io.StringIO()):
        try:
            torch.compile(t.module, backend="eager", fullgraph=True)(*t.inputs)
            return True
        except Exception:
            return False
        finally:
            torch.compiler.reset()


def test_collective_runs_in_a_one_process_group():
    report = explain_target(load_target(target("collective")), vary=[])
    assert any("gloo" in note for note in report["notes"])
    import torch.distributed as dist

    assert not dist.is_initialized()  # the group kiln made is gone again


def test_break_in_a_loop_says_the_function_ran_eagerly():
    report = explain_target(load_target(target("loop_print")), vary=[])
    brk = next(b for b in report["breaks"] if b["line"] == marker_line("loop"))
    assert brk["category"] == classify.PRINT_LOGGING
    assert brk["frame_skipped"] and "eagerly" in brk["hint"]


def test_clean_model_has_one_graph_and_no_breaks():
    report = explain_target(load_target(target("clean")), vary=[])
    assert report["graph_count"] == 1 and report["graph_break_count"] == 0 and report["breaks"] == []
    assert report["fullgraph_ok"] and report["fullgraph_blocker"] is None
    assert report["ops_per_graph"][0] >= 1


def test_train_records_backward_graphs():  # also the default for a module in training mode
    report = explain_target(load_target(target("clean")), vary=[], train=True)
    assert report["backend"] == "aot_eager"
    assert report["backward_ops_per_graph"] and report["backward_ops_per_graph"][0] > 0


@pytest.mark.parametrize(
    ("reason", "code", "category"),
    [
        ("generic_jump TensorVariable()", "if x.sum() > 0:", classify.DATA_DEPENDENT_BRANCH),  # torch 2.6 wording
        ("Tensor.item", "v = x.item()", classify.SCALAR_OUTPUT),
        ("call_function BuiltinVariable(print) [TensorVariable()] {}", "print(x)", classify.PRINT_LOGGING),
        ("Attempted to call function marked as skipped: pybind11_object.__new__ (e.g. _warnings.warn)",
         "dist.barrier()", classify.COLLECTIVE),
        ("dynamic shape operator: aten.nonzero.default", "i = x.nonzero()", classify.DYNAMIC_SHAPE),
        ("something new", "y = np.fft.fft(a)", classify.NUMPY),
        ("something new", "y = f(x)", classify.OTHER),
    ],
)
def test_classifier_reads_old_and_new_wordings(reason, code, category):
    assert classify.classify_break(reason, code) == category
