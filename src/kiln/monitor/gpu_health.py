"""GPU health through NVML: a background thread samples the rank's GPU (~1 Hz), and each log
interval folds the samples taken since the last log into the metric record (min/mean/max).

NVML reads driver counters over ctypes (the GIL is released during the call), so a sample costs
the training loop a few tens of microseconds of Python once a second and no device
synchronisation; benchmarks/nvml_overhead.py measures it against sampling off.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from typing import Any

import torch

from kiln.monitor.nvml import NVML_HINT, device_handle, import_nvml

log = logging.getLogger("kiln.monitor")

# nvmlClocksEventReasons (formerly "throttle reasons") bits, from nvml.h.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
# Reasons that mean a busy GPU runs below the clock it could reach (idle and clock settings are benign).
SLOWDOWN_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80

# Per-rank values gathered to rank 0 at log steps (one float each, NaN where unknown).
RANK_KEYS = ("gpu_util_pct", "gpu_mem_used_bytes", "gpu_temp_c", "gpu_power_w", "gpu_sm_clock_mhz",
             "gpu_throttle_frac")


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS if mask & bit]


class NvmlReader:
    """Reads one GPU's counters. Counters a GPU does not support are left out of the sample."""

    def __init__(self, pynvml: Any, handle: Any) -> None:
        self.nvml = pynvml
        self.handle = handle
        self.static: dict[str, float] = {}
        for key, read in (
            ("gpu_mem_total_bytes", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            ("gpu_power_limit_w", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3),
            ("gpu_sm_clock_max_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)),
        ):
            value = self._try(read)
            if value is not None:
                self.static[key] = float(value)
        # nvml >= 12.x renamed "throttle reasons" to "clocks event reasons"; keep both spellings.
        self._reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)

    def _try(self, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except self.nvml.NVMLError:  # not supported on this GPU / driver: leave the counter out
            return None

    def read(self) -> dict[str, float]:
        nvml, h = self.nvml, self.handle
        sample: dict[str, float] = {}
        util = self._try(lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            sample["util"] = float(util.gpu)
            sample["mem_bw"] = float(util.memory)
        for key, read, scale in (
            ("mem_used", lambda: nvml.nvmlDeviceGetMemoryInfo(h).used, 1.0),
            ("temp", lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU), 1.0),
            ("power", lambda: nvml.nvmlDeviceGetPowerUsage(h), 1e-3),  # milliwatts
            ("sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM), 1.0),
            ("throttle", (lambda: self._reasons(h)) if self._reasons else (lambda: None), 1.0),
        ):
            value = self._try(read)
            if value is not None:
                sample[key] = float(value) * scale
        return sample

    def close(self) -> None:
        self.nvml.nvmlShutdown()


def open_nvml_reader(device: torch.device) -> tuple[NvmlReader | None, str]:
    """A reader for `device`, or None and the reason there is none (said once, as an info line)."""
    if device.type != "cuda":
        return None, "CPU run"
    pynvml = import_nvml()
    if pynvml is None:
        return None, NVML_HINT
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no NVIDIA GPU (e.g. ROCm): NVMLError of several kinds
        return None, f"NVML unavailable ({exc})"
    try:
        return NvmlReader(pynvml, device_handle(pynvml, device)), "ok"
    except Exception as exc:
        pynvml.nvmlShutdown()
        return None, f"NVML has no handle for {device} ({exc})"


def _stats(samples: list[dict[str, float]], key: str) -> tuple[float, float, float] | None:
    values = [s[key] for s in samples if key in s]
    if not values:
        return None
    return min(values), sum(values) / len(values), max(values)


def fold_samples(samples: list[dict[str, float]], static: dict[str, float]) -> dict[str, Any]:
    """Metric-record keys for a list of samples: min/mean/max where it matters."""
    out: dict[str, Any] = {"gpu_health_samples": len(samples), **static}
    for key, prefix, unit, want in (
        ("util", "gpu_util", "pct", ("mean", "min", "max")),
        ("mem_bw", "gpu_mem_bw_util", "pct", ("mean",)),
        ("mem_used", "gpu_mem_used", "bytes", ("max",)),
        ("temp", "gpu_temp", "c", ("max",)),
        ("power", "gpu_power", "w", ("mean", "max")),
        ("sm_clock", "gpu_sm_clock", "mhz", ("mean", "min")),
    ):
        stats = _stats(samples, key)
        if stats is None:
            continue
        named = dict(zip(("min", "mean", "max"), stats))
        for i, which in enumerate(want):  # the first statistic is the plain key: the one to plot
            out[f"{prefix}_{unit}" if i == 0 else f"{prefix}_{unit}_{which}"] = named[which]
    masks = [int(s["throttle"]) for s in samples if "throttle" in s]
    if masks:
        union = 0
        for m in masks:
            union |= m
        out["gpu_throttle_frac"] = sum(bool(m & SLOWDOWN_MASK) for m in masks) / len(masks)
        out["gpu_throttle_reasons"] = throttle_names(union)
    return out


class GpuHealthSampler:
    """Samples `reader` every `period_s` seconds in a daemon thread; `fold()` at a log step."""

    def __init__(self, reader: Any, period_s: float = 1.0) -> None:
        self.reader = reader
        self.period_s = period_s
        self._lock = threading.Lock()
        self._samples: list[dict[str, float]] = []
        self._last: dict[str, float] | None = None
        self._all: list[dict[str, float]] = []  # the whole run, for summary.json (1 Hz: small)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_once(self) -> None:
        sample = self.reader.read()
        with self._lock:
            self._samples.append(sample)
            self._all.append(sample)
            self._last = sample

    def _loop(self) -> None:
        while True:
            try:
                self.sample_once()
            except Exception as exc:  # a GPU that fell off the bus must not kill training
                log.warning("GPU health: sampling stopped (%s: %s)", type(exc).__name__, exc)
                return
            if self._stop.wait(self.period_s):
                return

    def start(self) -> GpuHealthSampler:
        self._thread = threading.Thread(target=self._loop, name="kiln-gpu-health", daemon=True)
        self._thread.start()
        return self

    def fold(self) -> dict[str, Any]:
        """Stats of the samples since the last fold. An interval shorter than the period may hold
        none: then the latest sample stands in (`gpu_health_samples: 0` says so)."""
        with self._lock:
            samples, self._samples = self._samples, []
            last = self._last
        out = fold_samples(samples or ([last] if last else []), self.reader.static)
        out["gpu_health_samples"] = len(samples)
        return out

    def rank_values(self, folded: dict[str, Any]) -> list[float]:
        return [float(folded[k]) if folded.get(k) is not None else math.nan for k in RANK_KEYS]

    def summary(self) -> dict[str, Any]:
        with self._lock:
            samples = list(self._all)
        folded = fold_samples(samples, self.reader.static)
        return {k.removeprefix("gpu_"): v for k, v in folded.items()}

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.reader.close()


def start_gpu_health(enabled: bool, device: torch.device, period_s: float) -> GpuHealthSampler | None:
    """A started sampler, or None with one info line saying why GPU health is off."""
    if not enabled:
        return None
    reader, reason = open_nvml_reader(device)
    if reader is None:
        log.info("GPU health off: %s", reason)
        return None
    return GpuHealthSampler(reader, period_s).start()
