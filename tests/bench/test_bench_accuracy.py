"""The accuracy rule (PyTorch benchmark harness semantics), the RNG probe, speedup math."""

from __future__ import annotations

import torch

from kiln.bench.compile.compile_rows import timing_figures
from kiln.bench.compile.recipe_accuracy import compare, tolerance, uses_rng
from kiln.bench.compile.runner import BenchContext
from kiln.config import Config
from kiln.timing import Timing


def test_tolerances_follow_the_harness():
    assert tolerance("fp32", train=True) == 1e-2
    assert tolerance("fp32", train=False) == 1e-3
    assert tolerance("bf16-mixed", train=False) == 4e-3


def test_trajectory_within_tolerance_passes_and_a_drift_fails():
    fp64 = [2.0, 1.9, 1.8]
    ok = compare([2.0, 1.9, 1.8], [2.0001, 1.9001, 1.7999], fp64, precision="fp32", train=True)
    assert ok["accuracy"] == "pass" and ok["accuracy_rule"] == "fp64 rmse"
    bad = compare([2.0, 1.9, 1.8], [2.0, 2.4, 2.9], fp64, precision="fp32", train=True)
    assert bad["accuracy"] == "fail"
    assert "loss trajectory" in bad["accuracy_reason"] and bad["max_abs_err"] > 1.0


def test_fp64_reference_forgives_errors_no_worse_than_eager():
    # Both runs are 5% off the fp64 truth (beyond allclose), the compiled one no worse: pass.
    truth = torch.linspace(1, 2, 64, dtype=torch.float64)
    eager = (truth * 1.05).float()
    compiled = (truth * 0.95).float()
    assert compare(eager, compiled, truth, precision="fp32", train=False)["accuracy"] == "pass"
    worse = (truth * 1.3).float()
    assert compare(eager, worse, truth, precision="fp32", train=False)["accuracy"] == "fail"


def test_without_fp64_reference_cosine_similarity_decides():
    x = torch.randn(256)
    assert compare(x, x * 1.001, None, precision="fp32", train=False)["accuracy_rule"] == "cosine"
    assert compare(x, x * 1.001, None, precision="fp32", train=False)["accuracy"] == "pass"
    assert compare(x, -x, None, precision="fp32", train=False)["accuracy"] == "fail"


def test_rng_probe_sees_dropout_only_in_training():
    layer = torch.nn.Dropout(0.5)
    x = torch.ones(8)
    assert uses_rng(lambda: layer(x))[1]
    layer.eval()
    assert not uses_rng(lambda: layer(x))[1]
    q = torch.randn(1, 2, 4, 8)
    # SDPA carries the "random op" tag, but without dropout it draws nothing: no false alarm.
    assert not uses_rng(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))[1]


def test_speedup_math_uses_the_interleaved_medians():
    ctx = BenchContext(cfg=Config(), device=torch.device("cpu"), train=True, samples_per_step=64)
    timings = {
        "eager": Timing((0.030, 0.032, 0.031)),  # median 31 ms
        "compiled": Timing((0.020, 0.021, 0.019)),  # median 20 ms
        "eager_fp32": Timing((0.060, 0.062, 0.061)),  # median 61 ms
    }
    row = {"precision": "bf16-mixed"}
    timing_figures(ctx, row, timings, "compiled")
    assert abs(row["step_ms"] - 20.0) < 1e-9 and abs(row["eager_step_ms"] - 31.0) < 1e-9
    assert abs(row["speedup"] - 31 / 20) < 1e-9
    assert abs(row["speedup_vs_eager_fp32"] - 61 / 20) < 1e-9
    assert abs(row["throughput"] - 64 / 0.020) < 1e-6
    assert row["samples"] == 3 and row["step_ms_p10"] <= row["step_ms"] <= row["step_ms_p90"]
    fp32_row = {"precision": "fp32"}
    timing_figures(ctx, fp32_row, {"eager": timings["eager"], "compiled": timings["compiled"]}, "compiled")
    assert fp32_row["speedup_vs_eager_fp32"] == fp32_row["speedup"]

