"""kiln.profile.prefill: per-prefill figures and the verdict from a trace's events (synthetic GPU
timelines with known gaps, kernel times and wall time), and a recorded window on CPU."""

from __future__ import annotations

import pytest

from kiln.profile.prefill import record_prefill, render_prefill_profile, summarise_prefill
from kiln.profile.trace import load_trace

from .timelines import serial_timeline

TFLOP = 10**12
CALL = [("nvjet_hsh_256x128_gemm", 800.0), ("triton_poi_fused_rms_norm_0", 50.0), ("flash_fwd_kernel", 150.0)]
BUSY_US = 1000.0


def _timeline(calls: int, gap_us: float) -> list[dict]:
    return serial_timeline(calls, CALL, gap_us)


def _summary(gap_us: float, *, wall_ms: float | None = None, tflop: float = 0.5, calls: int = 4):
    span_ms = (calls * (BUSY_US + len(CALL) * gap_us) - gap_us) / 1e3 / calls
    wall = (wall_ms if wall_ms is not None else span_ms) * calls / 1e3
    return summarise_prefill(_timeline(calls, gap_us), calls=calls, wall_s=wall, device_type="cuda",
                             flops_per_call=int(tflop * TFLOP), matmul_flops_per_s=600 * TFLOP)


def test_figures_per_prefill_from_the_timeline():
    s = _summary(gap_us=100.0)
    gpu = s["gpu"]
    assert gpu["kernels_per_step"] == 3 and gpu["kernel_ms_per_step"] == pytest.approx(1.0)
    assert gpu["idle"]["idle_ms_per_step"] == pytest.approx(11 * 100.0 / 1e3 / 4)  # 11 gaps of 100 us in 4 prefills
    assert gpu["span_ms_per_step"] == pytest.approx(1.0 + 0.275)
    assert s["floor_ms_per_call"] == pytest.approx(0.5 / 600 * 1e3)  # 0.5 TFLOP at 600 TFLOP/s: 0.833 ms
    assert gpu["busy_compute_frac"] == pytest.approx(0.8333 / 1.0, rel=1e-3)
    assert s["wall_compute_frac"] == pytest.approx(0.8333 / 1.275, rel=1e-3)
    assert gpu["top_kernels"][0]["name"] == "nvjet_hsh_256x128_gemm"
    assert gpu["by_kind"]["matmul"]["ms_per_step"] == pytest.approx(0.8)
    assert gpu["by_kind"]["attention"]["ms_per_step"] == pytest.approx(0.15)


def test_the_verdict_names_the_largest_loss_first():
    gaps = _summary(gap_us=300.0)  # 0.825 ms idle per prefill of a 1.825 ms span
    assert gaps["verdict"].startswith("gaps: the GPU idles 0.825 ms/prefill (45% of its span) over 3 kernels")
    assert "kernels:" not in gaps["verdict"]  # 0.833 ms of compute in 1 ms busy: 83 % of the best matmul

    slow = _summary(gap_us=1.0, tflop=0.3)  # 0.5 ms floor, 1 ms busy
    assert slow["verdict"].startswith("kernels: while busy the GPU computes at 50% of the best matmul's rate "
                                      "(0.500 ms/prefill above the floor)")

    host = _summary(gap_us=1.0, wall_ms=3.0)  # 3 ms of wall time for a 1.003 ms span
    assert host["verdict"].startswith("host: 1.997 ms/prefill beyond the GPU's span")

    near = _summary(gap_us=1.0)
    assert near["verdict"].startswith("near the compute floor")


def test_without_flops_only_the_timeline_judges():
    s = summarise_prefill(_timeline(2, 1.0), calls=2, wall_s=2 * 1.003e-3, device_type="cuda", flops_per_call=None,
                          matmul_flops_per_s=600 * TFLOP)
    assert "floor_ms_per_call" not in s and "busy_compute_frac" not in s["gpu"]
    assert s["verdict"].startswith("near the compute floor")


def test_markdown_holds_the_figures_and_the_verdict():
    md = render_prefill_profile(_summary(gap_us=300.0), "Prefill profile: test")
    assert md.startswith("# Prefill profile: test")
    assert "wall; 500.000 GFLOP per prefill." in md
    assert "Compute floor 0.833 ms/prefill" in md
    tiny = dict(_summary(gap_us=300.0), flops_per_call=2_500_000)
    assert "; 2.500 MFLOP per prefill." in render_prefill_profile(tiny, "t")
    assert "**What bounds it:** gaps:" in md and "| GPU idle between kernels | 0.825 ms (45.2%) |" in md
    assert "| GPU busy | 1.000 ms (83.3% of the best matmul's rate while busy) |" in md
    assert "| `nvjet_hsh_256x128_gemm` | 1.00 | 800.0 |" in md and "| kernel | calls/prefill |" in md


def test_a_recorded_window_on_cpu(tmp_path, tiny_engine):
    engine = tiny_engine
    with pytest.raises(ValueError, match="at least one prefill"):
        record_prefill(engine, [[1, 2, 3]], new_tokens=4, calls=0, trace_path=tmp_path / "t.json")
    trace = tmp_path / "t.pt.trace.json.gz"
    wall = record_prefill(engine, [[1, 2, 3], [4, 5]], new_tokens=4, calls=3, trace_path=trace)
    assert wall > 0
    events = load_trace(trace)
    assert len([e for e in events if e.get("name") == "kiln.prefill_window"]) == 1
    s = summarise_prefill(events, calls=3, wall_s=wall, device_type="cpu", flops_per_call=1000, matmul_flops_per_s=None)
    assert s["gpu"]["status"] == "n/a" and "floor_ms_per_call" not in s
    ops = {op["name"] for op in s["cpu"]["top"]}
    assert ops & {"aten::mm", "aten::addmm", "aten::linear", "aten::bmm"}  # the prompt's projections
    assert s["verdict"].startswith("no GPU timeline on this device; the host op taking most time is")
