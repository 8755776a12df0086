"""The training meter's reported figures on known inputs, exactly, with a fake clock: a changed
formula for step time, samples/s, tokens/s, TFLOP/s or MFU (per log record and in the summary)
fails here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import kiln.train.meter as meter
from kiln.train.meter import IntervalMeter


class _Clock:
    """time.perf_counter for the meter: the test sets `now`."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = _Clock()
    monkeypatch.setattr(meter, "time", SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


def _interval(m: IntervalMeter, clock: _Clock, steps: int, seconds: float, loss: float, step: int) -> dict:
    """`steps` steps of loss `loss` taking `seconds` in all, closed at `step`."""
    for _ in range(steps):
        m.add_step(torch.tensor(loss))
    clock.now += seconds
    return m.record(step, lr=1e-3, grad_norm=None)


def test_record_and_summary_figures_on_a_fake_clock(clock):
    m = IntervalMeter(torch.device("cpu"), samples_per_step=8, tokens_per_step=1000, world_size=1,
                      flops_per_step=3_000_000_000_000, peak_flops=12e12)
    first = _interval(m, clock, steps=4, seconds=2.0, loss=2.5, step=4)  # 0.5 s per step
    assert first["first_step"] and first["loss"] == 2.5 and first["lr"] == 1e-3
    assert first["step_ms"] == 500.0
    assert first["samples_per_s"] == 16.0  # 8 samples / 0.5 s
    assert first["tokens_per_s"] == 2000.0  # 1000 tokens / 0.5 s
    assert first["tflops"] == 6.0  # 3e12 FLOP / 0.5 s, per device
    assert first["mfu"] == 0.5  # 6 TFLOP/s of a 12 TFLOP/s peak
    assert first["data_wait_frac"] == 0.0 and m.first_step_s == 2.0

    m.add_data_wait(0.25)
    second = _interval(m, clock, steps=2, seconds=0.5, loss=1.5, step=6)  # 0.25 s per step
    assert "first_step" not in second
    assert second["step_ms"] == 250.0 and second["samples_per_s"] == 32.0 and second["tokens_per_s"] == 4000.0
    assert second["tflops"] == 12.0 and second["mfu"] == 1.0
    assert second["data_wait_frac"] == 0.5

    summary = m.summary(second)  # steady state: the intervals after the first (0.25 s per step)
    assert summary["first_loss"] == 2.5 and summary["final_loss"] == 1.5 and summary["first_step_s"] == 2.0
    assert summary["step_ms_median"] == 250.0
    assert summary["samples_per_s"] == 32.0 and summary["samples_per_s_per_device"] == 32.0
    assert summary["tokens_per_s"] == 4000.0
    assert summary["mfu"] == 1.0 and summary["flops_per_step"] == 3_000_000_000_000
    assert summary["peak_flops"] == 12e12


def test_throughput_counts_every_rank_and_flops_stay_per_device(clock):
    """world_size 2 (one process, no collectives: the meter's figures as rank 0 computes them)."""
    m = IntervalMeter(torch.device("cpu"), samples_per_step=8, tokens_per_step=1000, world_size=2,
                      flops_per_step=3_000_000_000_000, peak_flops=12e12)
    rec = _interval(m, clock, steps=4, seconds=2.0, loss=1.0, step=4)
    assert rec["step_ms"] == 500.0
    assert rec["samples_per_s"] == 32.0 and rec["samples_per_s_per_device"] == 16.0
    assert rec["tokens_per_s"] == 4000.0
    assert rec["tflops"] == 6.0 and rec["mfu"] == 0.5
    summary = m.summary(rec)  # one interval: its own step time stands in for the steady state
    assert summary["samples_per_s"] == 32.0 and summary["tokens_per_s"] == 4000.0 and summary["mfu"] == 0.5


def test_a_model_without_tokens_or_flops_reports_neither(clock):
    m = IntervalMeter(torch.device("cpu"), samples_per_step=8, tokens_per_step=None, world_size=1,
                      flops_per_step=None, peak_flops=None)
    rec = _interval(m, clock, steps=1, seconds=0.5, loss=1.0, step=1)
    assert rec["samples_per_s"] == 16.0
    assert not {"tokens_per_s", "tflops", "mfu"} & rec.keys()
    assert not {"tokens_per_s", "mfu", "flops_per_step"} & m.summary(rec).keys()
