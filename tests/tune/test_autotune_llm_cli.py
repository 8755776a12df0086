"""`kiln autotune` with an LLM config on a CPU: bad input exits 2 before any work; a real search over
a small space trains each candidate and writes best.toml and the evidence."""

from __future__ import annotations

import json

import pytest

from kiln.cli.main import main
from kiln.config import load_config
from kiln.models.hf import PRESETS
from kiln.tune import autotune_check


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({**PRESETS["llama-tiny"], "head_dim": 16}))
    return [f"model.name=llama:{path}", "data.seq_len=16", "data.batch_size=2", "training.device=cpu"]


@pytest.mark.parametrize(("args", "needles"), [
    (["--ac", "some"], ["--ac", "'some'", "selective"]),
    (["--batch-sizes", "0,2"], ["--batch-sizes", ">= 1"]),
    (["--batch-sizes", "two"], ["--batch-sizes", "integers"]),
    (["--float8", "fp4"], ["--float8", "rowwise"]),
    (["--precisions", "fp32"], ["--precisions", "bf16-master"]),
    (["--ce-kernels", "fused"], ["--ce-kernels", "chunked"]),
    (["--compile-scopes", "step"], ["--compile-scopes", "regional"]),
    (["--budget", "0"], ["--budget", "> 0"]),
    (["--loss-tol", "0"], ["--loss-tol", "> 0"]),
    (["training.activation_checkpointing=some"], ["training.activation_checkpointing", "selective"]),
])
def test_bad_input_exits_2_before_any_work(tmp_path, tiny, bad_input, args, needles):
    out = tmp_path / "out"
    bad_input(["autotune", "--out", str(out), *args, *tiny], needles)
    assert not out.exists()


def test_llm_search_writes_the_winner(tmp_path, tiny, capsys, monkeypatch):
    # A CPU without native bf16, whatever this machine's is: the precision policy is not searched
    # (the native case: tests/tune/test_llm_search.py).
    monkeypatch.setattr(autotune_check, "cpu_bf16_native", lambda: False)
    out = tmp_path / "tune"
    code = main(["autotune", "--budget", "10", "--steps", "3", "--warmup", "0", "--batch-sizes", "2,4",
                 "--ac", "none,full", "--ce-kernels", "chunked", "--compile-scopes", "off", "--out", str(out), *tiny])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    payload = json.loads((out / "results.json").read_text())
    rows = [r for r in payload["results"] if r["status"] != "skipped"]
    # The baseline is the config as given: `default`, or `winner` when it measured fastest (timing decides).
    assert rows[0]["stage"] == "baseline" and rows[0]["role"] in ("default", "winner")
    assert [r["role"] for r in rows].count("winner") == 1
    assert {r["stage"] for r in rows} <= {"baseline", "ac", "batch"}
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 and r["loss_last"] > 0 for r in rows)
    assert "float8 not searched" in " ".join(payload["config"]["autotune"]["notes"])
    assert "precision policy not searched" in " ".join(payload["config"]["autotune"]["notes"])
    winner = payload["config"]["autotune"]["winner"]
    best = load_config(out / "best.toml")
    assert best.data.batch_size == winner["batch"]
    assert best.training.activation_checkpointing == winner["ac"]
    assert best.model.name == tiny[0].split("=", 1)[1]
    assert "## Decision" in (out / "results.md").read_text()
    assert "--batch-sizes 2,4 --ac none,full --ce-kernels chunked --compile-scopes off" in payload["command"]
    assert "kiln train --config" in captured.out
