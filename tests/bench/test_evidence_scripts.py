"""benchmarks/plain_crosscheck.py (the plain loop without kiln) and benchmarks/evidence_summary.py."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tests.benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_crosscheck_imports_no_kiln_and_times_both_ways(tmp_path):
    source = (ROOT / "benchmarks" / "plain_crosscheck.py").read_text()
    assert "kiln" not in "".join(line for line in source.splitlines() if line.startswith(("import", "from")))
    crosscheck = load_script("plain_crosscheck")
    precision = torch.get_float32_matmul_precision()  # the script sets TF32 as a user's script would
    try:
        assert crosscheck.main(["--model", "mlp", "--mode", "none", "--clip", "0,1", "--steps", "2", "--warmup", "1",
                                "--batch", "4", "--mlp-width", "16", "--mlp-depth", "1", "--out", str(tmp_path)]) == 0
    finally:  # process-wide torch state: later tests must not inherit it
        torch.set_float32_matmul_precision(precision)
    result = json.loads((tmp_path / "crosscheck_mlp.json").read_text())
    assert [r["grad_clip"] for r in result["runs"]] == [0.0, 1.0]
    assert result["settings"]["schedule"] == "cosine" and result["settings"]["batch"] == 4
    for run in result["runs"]:
        assert run["step_ms_alone"] > 0 and run["step_ms_interleaved"] > 0 and run["eager_step_ms_interleaved"] > 0
        assert "eager_fp32_step_ms_interleaved" not in run


def test_crosscheck_interleaves_an_fp32_twin_in_the_bench_order(tmp_path, monkeypatch):
    crosscheck = load_script("plain_crosscheck")
    calls: list[str] = []
    make = crosscheck.make_step

    def spy(model_name, net, clip, mode, device, precision=None):
        step = make(model_name, net, clip, mode, device, precision)
        tag = "fp32" if precision == "fp32" else "compiled" if mode else "eager"
        return lambda x, y: (calls.append(tag), step(x, y))[1]

    monkeypatch.setattr(crosscheck, "make_step", spy)
    monkeypatch.setattr(crosscheck.torch, "compile", lambda net, mode=None: net)  # no compiler on a CPU smoke run
    run = crosscheck.run_clip("mlp", 0.0, "default", 1, 3, torch.device("cpu"), fp32_twin=True, batch=4, width=8, depth=1)
    assert run["eager_fp32_step_ms_interleaved"] > 0
    # first step, one warm-up step each, three rounds eager -> compiled -> fp32, then one + three alone
    assert calls == ["compiled", "eager", "compiled", "fp32", *["eager", "compiled", "fp32"] * 3, *["compiled"] * 4]


def test_summary_pairs_bench_plain_rows_with_the_standalone_loop(tmp_path):
    summary = load_script("evidence_summary")
    assert summary.within(104.9, 100.0) and not summary.within(105.1, 100.0) and summary.within(None, 1.0) is None
    (tmp_path / "crosscheck").mkdir()
    (tmp_path / "crosscheck" / "crosscheck_mlp.json").write_text(json.dumps({"runs": [
        {"grad_clip": 0.0, "step_ms_alone": 3.82, "step_ms_interleaved": 4.6},
        {"grad_clip": 1.0, "step_ms_alone": 5.79, "step_ms_interleaved": 5.9}]}))
    for clip, (inter, alone) in {"0": (4.64, 3.9), "1": (5.62, 5.7)}.items():
        (tmp_path / f"mlp_clip{clip}").mkdir()
        rows = [{"runner": "plain", "mode": "eager", "step_ms": 99.0},
                {"runner": "plain", "mode": "reduce-overhead", "status": "ok", "step_ms": inter, "step_ms_alone": alone,
                 "schedule": "cosine"}]
        (tmp_path / f"mlp_clip{clip}" / "results.json").write_text(json.dumps({"results": rows}))
    assert summary.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    got = json.loads((tmp_path / "out" / "summary.json").read_text())
    mlp = {e["grad_clip"]: e for e in got["plain"] if e["model"] == "mlp"}
    assert mlp[0.0]["bench_plain_step_ms"] == 4.64 and mlp[0.0]["standalone_step_ms_alone"] == 3.82
    assert mlp[0.0]["within_5pct_interleaved"] is True and mlp[0.0]["within_5pct_alone"] is True
    assert mlp[0.0]["within_5pct_bench_vs_standalone"] is False  # 4.64 against 3.82: the gap the method makes
    assert mlp[1.0]["within_5pct_alone"] is True
    assert any("vit_clip0" in m for m in got["missing"])
    assert "seed MLP" in (tmp_path / "out" / "summary.md").read_text()


def test_summary_brackets_the_bench_between_two_standalone_runs(tmp_path):
    summary = load_script("evidence_summary")
    for name, inter in (("crosscheck_before", (24.0, 26.0)), ("crosscheck_after", (25.0, 28.6))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "crosscheck_vit.json").write_text(json.dumps({"runs": [
            {"grad_clip": 1.0, "step_ms_alone": 30.0, "step_ms_interleaved": inter[1]},
            {"grad_clip": 0.0, "step_ms_alone": 20.0, "step_ms_interleaved": inter[0]}]}))
    (tmp_path / "vit_clip0").mkdir()
    rows = [{"runner": "plain", "mode": "default", "status": "ok", "step_ms": 23.0, "step_ms_alone": 20.0}]
    (tmp_path / "vit_clip0" / "results.json").write_text(json.dumps({"results": rows}))
    assert summary.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    got = json.loads((tmp_path / "out" / "summary.json").read_text())
    vit = {e["grad_clip"]: e for e in got["plain"] if e["model"] == "vit"}
    assert vit[0.0]["standalone_step_ms_interleaved"] == 24.5  # the mean of 24.0 and 25.0
    assert vit[0.0]["bracket_step_ms_interleaved"] == [24.0, 25.0]
    assert abs(vit[0.0]["bracket_drift_step_ms_interleaved"] - 25.0 / 24.0 + 1) < 1e-12
    assert vit[0.0]["within_5pct_interleaved"] is False  # 23.0 is 6.1 % under 24.5
    assert vit[1.0]["standalone_step_ms_interleaved"] == 27.3 and vit[1.0]["bracket_drift_step_ms_interleaved"] > 0.09
    assert not any("crosscheck_vit" in m for m in got["missing"])  # both bracket runs were there
    assert any("llm" in m for m in got["missing"])
    assert summary.main([str(tmp_path), "--out", str(tmp_path / "plain"), "--parts", "plain"]) == 0
    assert not any("llm" in m for m in json.loads((tmp_path / "plain" / "summary.json").read_text())["missing"])
    assert "before and after the bench" in (tmp_path / "out" / "summary.md").read_text()


def test_repeats_compare_medians_over_processes(tmp_path):
    summary = load_script("evidence_summary")
    (tmp_path / "script").mkdir()
    runs = [{"grad_clip": 0.0, "step_ms_alone": a, "step_ms_interleaved": i}
            for a, i in ((4.0, 5.0), (3.0, 4.0), (3.5, 4.4), (5.0, 6.0))]
    (tmp_path / "script" / "crosscheck_mlp.json").write_text(json.dumps({"runs": runs}))
    for n, (inter, alone) in enumerate(((4.5, 3.6), (4.2, 3.7), (9.9, 3.9)), start=1):
        (tmp_path / f"bench_clip0_{n}").mkdir()
        rows = [{"runner": "plain", "mode": "eager", "status": "ok", "step_ms": 99.0},
                {"runner": "plain", "mode": "reduce-overhead", "status": "ok", "step_ms": inter, "step_ms_alone": alone}]
        (tmp_path / f"bench_clip0_{n}" / "results.json").write_text(json.dumps({"results": rows}))
    assert summary.main([str(tmp_path), "--parts", "repeats", "--out", str(tmp_path / "out")]) == 0
    got = json.loads((tmp_path / "out" / "summary.json").read_text())
    (entry,) = got["repeats"]
    assert entry["script_runs"] == 4 and entry["bench_runs"] == 3 and got["plain"] == []
    assert entry["script_median_step_ms_interleaved"] == 4.7 and entry["bench_median_step_ms_interleaved"] == 4.5
    assert entry["script_median_step_ms_alone"] == 3.75 and entry["bench_median_step_ms_alone"] == 3.7
    assert abs(entry["gap_step_ms_interleaved"] - (4.5 / 4.7 - 1)) < 1e-12 and entry["within_5pct_step_ms_interleaved"]
    assert abs(entry["script_spread_step_ms_alone"] - (5.0 / 3.0 - 1)) < 1e-12
    assert "| 4 / 3 | 4.5 | 4.7 | -4.3% |" in (tmp_path / "out" / "summary.md").read_text()
