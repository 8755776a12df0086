"""benchmarks/ab_headline.sh (the A/B of the headline GPU figures) and its summary, benchmarks/ab_summary.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from tests.benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "ab_headline.sh"


def _write(path: Path, payload: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    name = "summary.json" if "status" in payload else "results.json"
    (path / name).write_text(json.dumps(payload))


def _runs(tmp_path: Path) -> Path:
    """A runs dir as the script leaves it: two rounds (A,B then B,A), one failed and one skipped run."""
    ab = tmp_path / "ab"
    lines = []

    def run(case: str, tree: str, rnd: int, payload: dict | None, status: str = "ok", note: str = "") -> None:
        if payload is not None:
            _write(ab / case / f"{tree}{rnd}", payload)
        lines.append("\t".join([case, tree, str(rnd), status, "42", f"{case}/{tree}{rnd}", note]))

    train = lambda ms: {"status": "completed", "step_ms_median": ms}  # noqa: E731
    decode = lambda none, int4: {"results": [  # noqa: E731
        {"engine": "kiln-compiled", "quant": "none", "batch": 1, "status": "ok", "decode_tok_s": none},
        *([{"engine": "kiln-compiled", "quant": "int4@triton", "batch": 1, "status": "ok", "decode_tok_s": int4}]
          if int4 else [{"engine": "kiln-compiled", "quant": "int4@triton", "batch": 1, "status": "error",
                         "decode_tok_s": None}])]}
    bench = lambda ms: {"results": [  # noqa: E731
        {"runner": "kiln", "mode": "eager", "status": "ok", "step_ms": 9.0},
        {"runner": "kiln", "mode": "eager", "cudagraphs": True, "status": "ok", "step_ms": 1.8},
        {"runner": "kiln", "mode": "default", "cudagraphs": True, "status": "ok", "step_ms": ms}]}
    run("train_1b", "a", 1, train(100.0))
    run("train_1b", "b", 1, train(103.0))
    run("decode_3b", "a", 1, decode(380.0, 700.0))
    run("decode_3b", "b", 1, decode(372.0, None))
    run("mlp", "a", 1, bench(1.50))
    run("mlp", "b", 1, bench(1.53))
    run("vit", "a", 1, bench(19.6))
    run("vit", "b", 1, bench(19.3))
    run("mlp", "b", 2, bench(1.52))
    run("mlp", "a", 2, bench(1.54))
    # killed at its cap: kiln train's summary says failed, so its figure does not count
    run("train_1b", "b", 2, {"status": "failed", "step_ms_median": 999.0}, "failed",
        "exit 124: past its cap of 180 s, log train_1b/b2.log")
    run("train_1b", "a", 2, train(102.0))
    run("decode_3b", "b", 2, None, "skipped", "not started: the pair needs 190 s, 20 s of BUDGET_S=480 left")
    run("decode_3b", "a", 2, None, "skipped", "not started: the pair needs 190 s, 20 s of BUDGET_S=480 left")
    (ab / "runs.tsv").write_text("\n".join(lines) + "\n")
    return ab


def test_summary_medians_ratios_and_verdicts(tmp_path, monkeypatch):
    summary = load_script("ab_summary")
    monkeypatch.setattr(summary, "collect_env", lambda: {"torch": "x", "gpus": [{"name": "H100"}]})
    ab = _runs(tmp_path)
    argv = [str(ab), "--out", str(tmp_path / "out"), "--a-label", "before", "--b-label", "after",
            "--a-commit", "aaa111", "--b-commit", "bbb222"]
    assert summary.main(argv) == 0
    got = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = {r["figure"]: r for r in got["results"]}
    assert list(rows) == ["train_1b_step_ms", "decode_3b_none_tok_s", "decode_3b_int4@triton_tok_s", "mlp_step_ms",
                          "vit_step_ms"]
    # 1B step: A 100 and 102 (median 101), B 103 (its second run failed): 1.98 % slower, within 2 %.
    # bf16 decode of B's first run counts although its int4 row failed: each row has its own status.
    train = rows["train_1b_step_ms"]
    assert train["a_samples"] == [100.0, 102.0] and train["b_samples"] == [103.0]
    assert train["a_median"] == 101.0 and train["b_median"] == 103.0
    assert train["ratio_b_a"] == pytest.approx(103 / 101) and train["worse_pct"] == pytest.approx(100 * (103 / 101 - 1))
    assert train["a_spread"] == pytest.approx(2 / 101) and train["b_spread"] == 0.0
    assert (train["verdict"], train["status"]) == ("ok", "ok")
    # bf16 decode: tok/s, higher is better: 372 against 380 is 2.1 % worse.
    none = rows["decode_3b_none_tok_s"]
    assert none["ratio_b_a"] == pytest.approx(372 / 380) and none["worse_pct"] == pytest.approx(100 * (1 - 372 / 380))
    assert none["verdict"] == "worse"
    # int4: B's row failed, so the figure has no B sample.
    int4 = rows["decode_3b_int4@triton_tok_s"]
    assert (int4["verdict"], int4["status"], int4["n_a"], int4["n_b"]) == ("missing", "skipped", 1, 0)
    assert int4["ratio_b_a"] is None and "tree B" in int4["reason"]
    # seed MLP: the compiled row, not the eager ones; medians of two rounds each.
    mlp = rows["mlp_step_ms"]
    assert mlp["a_median"] == pytest.approx(1.52) and mlp["b_median"] == pytest.approx(1.525)
    assert mlp["verdict"] == "ok"
    # ViT: B faster, a negative worsening.
    vit = rows["vit_step_ms"]
    assert vit["worse_pct"] == pytest.approx(100 * (19.3 / 19.6 - 1)) and vit["verdict"] == "ok"
    assert got["config"]["a"] == {"label": "before", "commit": "aaa111", "tree": ""}
    assert got["config"]["b"]["commit"] == "bbb222" and len(got["config"]["runs"]) == 14
    md = (tmp_path / "out" / "results.md").read_text()
    assert "before (aaa111)" in md and "after (bbb222)" in md
    assert "3 ok, 1 worse: decode_3b_none_tok_s, 1 missing: decode_3b_int4@triton_tok_s" in md
    assert "exit 124: past its cap of 180 s" in md and "the pair needs 190 s" in md


def test_the_tolerance_is_exclusive_and_follows_the_figures_direction():
    summary = load_script("ab_summary")
    lower = summary.Figure("x", "mlp", "x", "ms/step", "lower")
    higher = summary.Figure("y", "decode_3b", "y", "tok/s", "higher")
    assert summary.compare(lower, [100.0], [102.0], 0.02)["verdict"] == "ok"  # exactly 2 % is not worse
    assert summary.compare(lower, [100.0], [102.01], 0.02)["verdict"] == "worse"
    assert summary.compare(lower, [100.0], [90.0], 0.02)["verdict"] == "ok"
    assert summary.compare(higher, [100.0], [98.0], 0.02)["verdict"] == "ok"
    assert summary.compare(higher, [100.0], [97.99], 0.02)["verdict"] == "worse"
    assert summary.compare(higher, [100.0], [110.0], 0.02)["worse_pct"] == pytest.approx(-10.0)
    assert summary.compare(higher, [], [1.0], 0.02)["verdict"] == "missing"


def _dry(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AB_DRY": "1", **env})


def test_dry_run_interleaves_the_trees_with_their_own_paths_and_caches():
    done = _dry(AB_A="/x/base/src", AB_A_COMMIT="aaa111", AB_B_COMMIT="bbb222")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    runs = [re.match(r"round (\d) (\w+) ([ab]): env (.*)", line).groups() for line in lines[:-1]]
    order = [(int(r), case, tree) for r, case, tree, _ in runs]
    assert order == [(1, "train_1b", "a"), (1, "train_1b", "b"), (1, "decode_3b", "a"), (1, "decode_3b", "b"),
                     (1, "mlp", "a"), (1, "mlp", "b"), (1, "vit", "a"), (1, "vit", "b"),
                     # round 2: B first, the cheapest pairs first
                     (2, "mlp", "b"), (2, "mlp", "a"), (2, "vit", "b"), (2, "vit", "a"),
                     (2, "train_1b", "b"), (2, "train_1b", "a"), (2, "decode_3b", "b"), (2, "decode_3b", "a")]
    for _, _case, tree, command in runs:
        path = "PYTHONPATH=/x/base/src" if tree == "a" else f"PYTHONPATH={ROOT}/src"
        assert command.startswith(path) and f"TORCHINDUCTOR_CACHE_DIR=/tmp/kiln-ab-cache/{tree}/inductor" in command
        assert f"TRITON_CACHE_DIR=/tmp/kiln-ab-cache/{tree}/triton" in command
    commands = {case: command for _, case, _, command in runs}
    assert "kiln train" in commands["train_1b"] and "model.name=llama:llama-3.2-1b" in commands["train_1b"]
    assert all(k in commands["train_1b"] for k in ("precision.policy=bf16-master", "compile.scope=model+loss",
                                                    "training.ce_kernel=triton", "checkpoint.save_final=false"))
    assert "kiln bench llm --model llama-3.2-3b --engines kiln-compiled" in commands["decode_3b"]
    assert "--batch 1 --quant none,int4@triton" in commands["decode_3b"]
    assert "--preset seed000-levels --precisions fp32" in commands["mlp"] and "--cudagraphs on" in commands["mlp"]
    assert "--preset seed001-vit --precisions bf16-true" in commands["vit"] and "--regional off" in commands["vit"]
    assert lines[-1].startswith("summary: python3 benchmarks/ab_summary.py")
    assert "--a-commit aaa111" in lines[-1] and "--b-commit bbb222" in lines[-1]


def test_dry_run_takes_cases_and_rounds_and_refuses_unknown_cases_and_missing_trees():
    done = _dry(CASES="vit,mlp", ROUNDS="1")
    assert [line.split(":")[0] for line in done.stdout.splitlines()[:-1]] == [
        "round 1 vit a", "round 1 vit b", "round 1 mlp a", "round 1 mlp b"]
    bad = _dry(CASES="mlp,resnet")
    assert bad.returncode == 2 and "unknown case 'resnet'" in bad.stderr
    missing = _dry(AB_DRY="0", AB_A="/nonexistent/src")
    assert missing.returncode == 2 and "/nonexistent/src/kiln is missing" in missing.stderr


def test_decode_batches_each_give_a_figure(tmp_path, monkeypatch):
    """DECODE_BATCH=1,16: the bench runs both batch sizes and the summary compares each, batch 1 under
    its old key; a batch not asked for is not compared."""
    summary = load_script("ab_summary")
    monkeypatch.setattr(summary, "collect_env", lambda: {"torch": "x"})
    ab = tmp_path / "ab"
    for tree, tok_s in (("a", (500.0, 6000.0, 9000.0)), ("b", (495.0, 6400.0, 9100.0))):
        _write(ab / "decode_3b" / f"{tree}1", {"results": [
            {"engine": "kiln-compiled", "quant": "none", "batch": b, "status": "ok", "decode_tok_s": t}
            for b, t in zip((1, 16, 32), tok_s)]})
    (ab / "runs.tsv").write_text("decode_3b\ta\t1\tok\t90\tdecode_3b/a1\t\ndecode_3b\tb\t1\tok\t90\tdecode_3b/b1\t\n")
    assert summary.main([str(ab), "--out", str(tmp_path / "out"), "--decode-quant", "none",
                         "--decode-batch", "1,16"]) == 0
    rows = {r["figure"]: r for r in json.loads((tmp_path / "out" / "results.json").read_text())["results"]}
    assert list(rows) == ["decode_3b_none_tok_s", "decode_3b_none_b16_tok_s"]
    assert rows["decode_3b_none_b16_tok_s"]["ratio_b_a"] == pytest.approx(6400 / 6000)
    assert rows["decode_3b_none_b16_tok_s"]["title"] == "3B decode, batch 16, bf16"
    assert rows["decode_3b_none_tok_s"]["ratio_b_a"] == pytest.approx(0.99)
    done = _dry(DECODE_BATCH="1,16")
    assert done.returncode == 0, done.stderr
    assert "--batch 1,16 --quant none,int4@triton" in done.stdout and "--decode-batch 1,16" in done.stdout
