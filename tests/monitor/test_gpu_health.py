"""GPU health sampling with NVML faked (no GPU on CI): reading, folding, the thread, turning off."""

from __future__ import annotations

import logging
import math
import sys
import threading
import types

import pytest
import torch

from kiln.monitor import gpu_health
from kiln.monitor.gpu_health import GpuHealthSampler, NvmlReader, fold_samples, start_gpu_health, throttle_names


class NVMLError(Exception):
    pass


def fake_nvml(util=(50, 20), temp=60, power_mw=300_000, clock=1980, reasons=0x0, unsupported=()):
    def maybe(name, value):
        def read(*_):
            if name in unsupported:
                raise NVMLError(name)
            return value() if callable(value) else value
        return read

    return types.SimpleNamespace(
        NVMLError=NVMLError, NVML_TEMPERATURE_GPU=0, NVML_CLOCK_SM=1,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByPciBusId=lambda address: "h", nvmlDeviceGetHandleByIndex=lambda i: "h",
        nvmlDeviceGetUtilizationRates=maybe("util", types.SimpleNamespace(gpu=util[0], memory=util[1])),
        nvmlDeviceGetMemoryInfo=maybe("mem", types.SimpleNamespace(used=2 << 30, total=80 << 30)),
        nvmlDeviceGetTemperature=maybe("temp", temp),
        nvmlDeviceGetPowerUsage=maybe("power", power_mw),
        nvmlDeviceGetEnforcedPowerLimit=maybe("limit", 700_000),
        nvmlDeviceGetClockInfo=maybe("clock", clock),
        nvmlDeviceGetMaxClockInfo=maybe("maxclock", 1980),
        nvmlDeviceGetCurrentClocksEventReasons=maybe("reasons", reasons),
    )


def test_reader_reads_and_scales_and_skips_unsupported():
    reader = NvmlReader(fake_nvml(reasons=0x4 | 0x1, unsupported=("power",)), "h")
    sample = reader.read()
    assert sample == {"util": 50.0, "mem_bw": 20.0, "mem_used": float(2 << 30), "temp": 60.0, "sm_clock": 1980.0,
                      "throttle": 5.0}
    assert reader.static == {"gpu_mem_total_bytes": float(80 << 30), "gpu_power_limit_w": 700.0,
                             "gpu_sm_clock_max_mhz": 1980.0}
    assert NvmlReader(fake_nvml(), "h").read()["power"] == 300.0  # milliwatts -> watts


def test_fold_gives_min_mean_max_and_throttle_reasons():
    samples = [
        {"util": 10.0, "temp": 50.0, "power": 100.0, "sm_clock": 1000.0, "mem_used": 5.0, "throttle": 0x1},
        {"util": 90.0, "temp": 70.0, "power": 300.0, "sm_clock": 2000.0, "mem_used": 7.0, "throttle": 0x20},
    ]
    out = fold_samples(samples, {"gpu_power_limit_w": 700.0})
    assert out["gpu_util_pct"] == 50.0 and out["gpu_util_pct_min"] == 10.0 and out["gpu_util_pct_max"] == 90.0
    assert out["gpu_temp_c"] == 70.0 and out["gpu_mem_used_bytes"] == 7.0
    assert out["gpu_power_w"] == 200.0 and out["gpu_power_w_max"] == 300.0
    assert out["gpu_sm_clock_mhz"] == 1500.0 and out["gpu_sm_clock_mhz_min"] == 1000.0
    assert out["gpu_throttle_frac"] == 0.5  # idle is benign, thermal slowdown is not
    assert out["gpu_throttle_reasons"] == ["gpu_idle", "sw_thermal_slowdown"]
    assert out["gpu_power_limit_w"] == 700.0 and out["gpu_health_samples"] == 2
    assert throttle_names(0x4 | 0x80) == ["sw_power_cap", "hw_power_brake_slowdown"]


class ScriptedReader:
    """Returns utilisation 10, 20, 30, ... and signals each read."""

    static = {"gpu_mem_total_bytes": 1.0}

    def __init__(self):
        self.n = 0
        self.read_event = threading.Event()
        self.closed = False

    def read(self):
        self.n += 1
        self.read_event.set()
        return {"util": 10.0 * self.n}

    def close(self):
        self.closed = True


def test_fold_takes_samples_since_last_fold_and_carries_the_latest():
    sampler = GpuHealthSampler(ScriptedReader())
    sampler.sample_once()
    sampler.sample_once()
    first = sampler.fold()
    assert first["gpu_util_pct"] == 15.0 and first["gpu_health_samples"] == 2
    empty = sampler.fold()  # an interval shorter than the period: the latest sample stands in
    assert empty["gpu_util_pct"] == 20.0 and empty["gpu_health_samples"] == 0
    assert sampler.summary()["util_pct_max"] == 20.0
    values = sampler.rank_values(first)
    assert values[0] == 15.0 and all(math.isnan(v) for v in values[1:])


def test_thread_samples_and_stops():
    reader = ScriptedReader()
    sampler = GpuHealthSampler(reader, period_s=3600).start()  # first sample at once, the next in an hour
    assert reader.read_event.wait(timeout=60)
    sampler.close()  # wakes the thread instead of waiting out the period
    assert reader.closed and sampler._thread is None
    assert sampler.fold()["gpu_health_samples"] == 1


def test_off_on_cpu_with_one_info_line(caplog):
    with caplog.at_level(logging.INFO, logger="kiln.monitor"):
        assert start_gpu_health(True, torch.device("cpu"), 1.0) is None
    assert [r.getMessage() for r in caplog.records] == ["GPU health off: CPU run"]
    assert start_gpu_health(False, torch.device("cuda", 0), 1.0) is None


def test_off_without_nvml(monkeypatch, caplog):
    monkeypatch.setattr(gpu_health, "import_nvml", lambda: None)
    with caplog.at_level(logging.INFO, logger="kiln.monitor"):
        assert start_gpu_health(True, torch.device("cuda", 0), 1.0) is None
    assert "pip install 'kiln[gpu]'" in caplog.text


def test_starts_with_fake_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(util=(77, 5)))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(pci_domain_id=0, pci_bus_id=1, pci_device_id=0))
    sampler = start_gpu_health(True, torch.device("cuda", 0), 3600)
    assert sampler is not None
    try:
        sampler.sample_once()
        assert sampler.fold()["gpu_util_pct"] == pytest.approx(77.0)
    finally:
        sampler.close()


def test_nvml_init_failure_turns_off(monkeypatch, caplog):
    nvml = fake_nvml()

    def broken():
        raise NVMLError("driver not loaded")

    nvml.nvmlInit = broken
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with caplog.at_level(logging.INFO, logger="kiln.monitor"):
        assert start_gpu_health(True, torch.device("cuda", 0), 1.0) is None
    assert "NVML unavailable (driver not loaded)" in caplog.text
