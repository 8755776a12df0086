"""kiln.profile.decode: per-step figures and the verdict from a trace's events (synthetic GPU
timelines with known gaps, kernel times and wall time), and a recorded window on CPU."""

from __future__ import annotations

import pytest

from kiln.profile.decode import record_decode, render_decode_profile, summarise_decode, window_fits
from kiln.profile.trace import load_trace

from .timelines import serial_timeline

GB = 10**9


_timeline = serial_timeline


STEP = [("triton_red_fused_mm_0", 300.0), ("triton_per_fused_softmax_1", 20.0), ("triton_poi_fused_add_2", 10.0)]
BUSY_US = 330.0


def _summary(gap_us: float, *, wall_ms: float | None = None, bytes_per_step: int = 900_000_000, steps: int = 10):
    events = _timeline(steps, STEP, gap_us)
    span_ms = (steps * (BUSY_US + len(STEP) * gap_us) - gap_us) / 1e3 / steps
    wall = (wall_ms if wall_ms is not None else span_ms) * steps / 1e3
    return summarise_decode(events, steps=steps, wall_s=wall, device_type="cuda", bytes_per_step=bytes_per_step,
                            copy_bytes_per_s=3000 * GB)


def test_figures_per_step_from_the_timeline():
    s = _summary(gap_us=20.0)
    gpu = s["gpu"]
    assert gpu["kernels_per_step"] == 3 and gpu["kernel_ms_per_step"] == pytest.approx(0.33)
    assert gpu["idle"]["busy_ms_per_step"] == pytest.approx(0.33)
    assert gpu["idle"]["idle_ms_per_step"] == pytest.approx((3 * 10 - 1) * 20.0 / 1e3 / 10)  # 29 gaps of 20 us
    assert gpu["idle"]["gap_us_median"] == pytest.approx(20.0)
    assert s["floor_ms_per_step"] == pytest.approx(0.3)  # 0.9 GB at 3 TB/s
    assert gpu["busy_bandwidth_frac"] == pytest.approx(0.3 / 0.33)
    assert gpu["top_kernels"][0]["name"] == "triton_red_fused_mm_0" and gpu["top_kernels"][0]["calls_per_step"] == 1


def test_the_verdict_names_the_largest_loss_first():
    gaps = _summary(gap_us=40.0)  # 0.116 ms idle/step of a 0.446 ms span: gaps dominate
    assert gaps["verdict"].startswith("gaps: the GPU idles 0.116 ms/step")
    assert "kernels:" not in gaps["verdict"]  # 0.3 ms of reading in 0.33 ms busy: 91% of copy bandwidth

    slow_kernels = _summary(gap_us=1.0, bytes_per_step=600_000_000)  # 0.2 ms floor, 0.33 ms busy
    assert slow_kernels["verdict"].startswith("kernels: while busy the GPU reads 61% of the copy bandwidth")

    host = _summary(gap_us=1.0, wall_ms=1.0)  # the host takes 1 ms per step for a 0.333 ms GPU span
    assert host["verdict"].startswith("host: 0.667 ms/step beyond the GPU's span")

    floor = _summary(gap_us=1.0, bytes_per_step=950_000_000)
    assert floor["verdict"].startswith("at the bandwidth floor")


def test_markdown_holds_the_figures_and_the_verdict():
    s = _summary(gap_us=40.0)
    md = render_decode_profile(s, "Decode profile: test")
    assert md.startswith("# Decode profile: test")
    assert "**What bounds it:** gaps:" in md and "| GPU idle between kernels | 0.116 ms" in md
    assert "`triton_red_fused_mm_0` | 1.00 | 300.0 |" in md


def test_a_window_must_fit_in_the_request():
    assert window_fits(256) == 253 and window_fits(3) == 0


def test_a_recorded_window_on_cpu(tmp_path, tiny_engine):
    engine = tiny_engine
    with pytest.raises(ValueError, match="does not fit"):
        record_decode(engine, [[1, 2, 3]], new_tokens=4, steps=2, trace_path=tmp_path / "t.json")
    trace = tmp_path / "t.pt.trace.json.gz"
    wall = record_decode(engine, [[1, 2, 3]], new_tokens=10, steps=5, trace_path=trace)
    assert wall > 0
    events = load_trace(trace)
    window = [e for e in events if e.get("name") == "kiln.decode_window"]
    assert len(window) == 1  # the annotated window, around the 5 steps
    s = summarise_decode(events, steps=5, wall_s=wall, device_type="cpu", bytes_per_step=1000,
                         copy_bytes_per_s=None)
    assert s["gpu"]["status"] == "n/a" and "floor_ms_per_step" not in s
    assert s["cpu"]["top"] and s["verdict"].startswith("no GPU timeline on this device")
