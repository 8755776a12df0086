"""`kiln explain` / `kiln doctor` on the command line: JSON contract, exit codes, one-line errors."""

from __future__ import annotations

import json

import pytest

from kiln.cli.main import main

from .conftest import EXAMPLES, PLANTED, marker_line, target

EXPLAIN_KEYS = {"graph_count", "graph_break_count", "breaks", "recompiles"}
BREAK_KEYS = {"category", "reason", "file", "line", "code", "hint"}
RECOMPILE_KEYS = {"reason", "guard", "file", "line", "hint"}


def test_explain_writes_the_contract_json(tmp_path, capsys):
    out = tmp_path / "explain.json"
    assert main(["explain", target("repeated"), "--vary", "scalars", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert EXPLAIN_KEYS <= set(report)
    assert all(RECOMPILE_KEYS <= set(r) for r in report["recompiles"]) and report["recompiles"]
    assert "Recompiles" in capsys.readouterr().out  # the rich report went to the screen


def test_explain_on_a_clean_model_says_so(tmp_path, capsys):
    out = tmp_path / "explain.json"
    assert main(["explain", target("clean"), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["recompiles"] == [] and report["breaks"] == [] and report["clean"] is True
    assert report["probes"][0]["expected"] is True
    shown = capsys.readouterr().out
    assert "clean: no graph breaks and no recompiles" in shown
    assert "Recompiles (" not in shown  # no problems table
    assert "If your inputs change" in shown and "(expected)" in shown


def test_explain_json_to_stdout_with_an_input_spec(capsys):
    assert main(["explain", target("item"), "--input", "float32:2x8", "--no-vary", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["inputs"] == ["float32[2, 8]"] and report["input_source"] == "--input"
    assert all(BREAK_KEYS <= set(b) for b in report["breaks"]) and report["breaks"][0]["line"] == marker_line("item")


def test_fullgraph_check_answers_yes_and_no(capsys):
    assert main(["explain", target("clean"), "--fullgraph-check", "--no-vary"]) == 0
    assert "fullgraph: yes" in capsys.readouterr().out
    assert main(["explain", f"{EXAMPLES / 'seed_graph_breaks.py'}:build", "--fullgraph-check", "--no-vary"]) == 1
    captured = capsys.readouterr()
    assert "fullgraph: no" in captured.out and "seed_graph_breaks.py" in captured.err


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["explain", "nope/missing.py:build"], ["TARGET", "missing.py"]),
        (["explain", f"{PLANTED}:no_such_function"], ["TARGET", "no_such_function", "relu_net"]),
        (["explain", "no_such_registry_model"], ["TARGET", "mlp"]),
        (["explain", target("clean"), "--input", "4xbanana"], ["--input", "4xbanana", "int64[0,512):2x32"]),
        (["explain", target("clean"), "--input", "complex7:4x8"], ["--input", "complex7", "float32"]),
        (["explain", target("clean"), "--vary", "sideways"], ["--vary", "batch"]),
        (["explain", target("clean"), "--backend", "nvfuser"], ["--backend", "inductor"]),
        (["doctor", target("clean"), "--mode", "max-performance"], ["--mode", "max-autotune"]),
        (["doctor", target("clean"), "--stages", "eager,warp9"], ["--backend", "warp9", "aot_eager"]),
        (["doctor", "mlp", "--kwarg", "hidden_sise=8"], ["--kwarg hidden_sise", "hidden_size"]),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, needles, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err


def test_registry_model_gets_inputs_from_its_spec(capsys):
    argv = ["explain", "mlp", "--kwarg", "hidden_size=16", "--kwarg", "num_layers=1", "--no-vary", "--json", "-"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["input_source"] == "input spec" and report["inputs"] == ["float32[4, 16]"]
    assert report["graph_break_count"] == 0


@pytest.mark.parametrize("factory", ["printer", "item"])
def test_explain_fullgraph_verdict_is_the_one_fullgraph_check_gives(factory, tmp_path, capsys):
    out = tmp_path / "explain.json"
    assert main(["explain", target(factory), "--no-vary", "--json", str(out)]) == 0
    shown = capsys.readouterr().out
    report = json.loads(out.read_text())
    verdict = report["fullgraph_ok"]
    assert "would fail: no" not in shown
    # The verdict agrees with the breaks listed: a break, so not one graph, whatever fullgraph=True does.
    assert report["breaks"] and verdict is False
    if factory == "printer":  # a print in forward: torch cannot trace it under fullgraph=True either
        assert "fullgraph=True: fails" in shown
    else:  # fullgraph=True captures `.item()` and compiles; the compile the user runs breaks there
        assert "fullgraph=True: compiles, but not as one graph as you run it" in shown
        assert report["fullgraph_blocker"]["fullgraph_compiles"] is True
    checked = main(["explain", target(factory), "--no-vary", "--fullgraph-check"])
    assert checked == 1
    assert "fullgraph: no" in capsys.readouterr().out
