"""`kiln autotune` on the command line, on a CPU: bad input exits 2 before any work; a real search
writes one decision that its rows, results.json and best.toml all agree on."""

from __future__ import annotations

import json

import pytest

from kiln.cli.main import main
from kiln.config import load_config

# A seed MLP whose step is dominated by per-op dispatch on a CPU (2 small blocks, batch 8), which
# inductor's C++ backend fuses, so a compiled recipe usually wins (the search test holds either way).
# Two blocks, not more: each search compiles its rows from the out dir's own empty inductor cache,
# and the compile time grows with the blocks while nothing the tests assert depends on their number.
TINY = ["model.kwargs.hidden_size=32", "model.kwargs.num_layers=2", "model.kwargs.num_classes=8",
        "model.kwargs.dropout=0.0", "data.batch_size=8", "data.synthetic_samples=64", "training.device=cpu"]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--budget", "0"], ["--budget", "> 0"]),
        (["--precisions", "fp8"], ["--precisions", "bf16-mixed"]),
        (["--modes", "max-performance"], ["--modes", "'max-autotune'", "reduce-overhead"]),
        (["--scopes", "everything"], ["--scopes", "model+loss"]),
        (["--steps", "1"], ["--steps", ">= 3"]),
        (["--config", "does/not/exist.toml"], ["does/not/exist.toml", "not found"]),
        (["--nproc-per-node", "0"], ["--nproc-per-node", ">= 1"]),
        (["compile.scpoe=step"], ["compile.scpoe", "scope"]),
        (["--budget", "soon"], ["--budget", "invalid float"]),
    ],
)
def test_bad_input_exits_2_with_one_line_before_any_work(tmp_path, bad_input, args, needles):
    out = tmp_path / "out"
    bad_input(["autotune", "--out", str(out), *args, *TINY], needles)
    assert not out.exists()


def test_autotune_real_search_writes_a_consistent_decision(tmp_path, capsys):
    """A real search on this CPU. Which recipe wins depends on the machine's load, so the test
    checks what must hold either way (the decision rule itself is tested with fixed timings in
    test_search.py): one winner, the decision states the winner row's own figure, and best.toml
    is a full config that differs from the default exactly in the winning keys."""
    out = tmp_path / "tune"
    # A budget far above what this small space takes (~1-2 min): the search ends when the space is
    # exhausted, so wall time on a loaded machine cannot decide which stages run.
    code = main(["autotune", "--budget", "20", "--steps", "15", "--modes", "default", "--scopes", "model,step",
                 "--no-regional", "--rank-noisy", "--out", str(out), *TINY])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    payload = json.loads((out / "results.json").read_text())
    rows = payload["results"]
    assert {"env", "config", "results"} <= set(payload)
    winners = [r for r in rows if r["role"] == "winner"]
    assert len(winners) == 1
    winner = winners[0]
    assert winner["status"] == "ok"
    decision = payload["config"]["autotune"]
    # The decision states the same figure as the winner's row.
    assert decision["speedup_vs_default"] == winner["speedup_vs_default"]
    best = load_config(out / "best.toml")
    base = load_config(None, TINY)
    assert best.model == base.model and best.data == base.data and best.optim == base.optim
    if winner["mode"] == "eager":  # the config's own recipe stayed: best.toml changes nothing
        assert not best.compile.enabled and not decision["changes"]
    else:  # a compiled recipe won: it passed the accuracy check and cleared the 2% rule
        default = next(r for r in rows if r["role"] == "default" and r["stage"] == "confirm")
        assert default["mode"] == "eager"
        assert winner["accuracy"] == "pass" and winner["speedup_vs_default"] >= 1.02
        assert best.compile.enabled and best.compile.scope == winner["scope"]
        assert "compile.enabled" in decision["changes"]
    md = (out / "results.md").read_text()
    assert "| stage | candidate | role | status |" in md and "## Decision" in md
    assert (out / "results.png").exists()
    assert "kiln train --config" in captured.out
