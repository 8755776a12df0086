"""Host memory: parameters this host cannot hold are refused (exit 2 naming the estimate and the
host's memory), and out-of-host-memory advice weighs the model, not only the batch. A training
run's whole estimate: tests/train/test_memory_plan.py."""

from __future__ import annotations

import pytest

from kiln.config import load_config
from kiln.failure.classify import diagnose
from kiln.models import host_memory
from kiln.models.host_memory import GIB, check_fits, training_state_bytes


def test_the_estimate_counts_weights_grads_and_optimizer_state():
    assert training_state_bytes(10, device_type="cpu", optimizer="adamw") == 10 * (4 + 4 + 8)
    assert training_state_bytes(10, device_type="cpu", optimizer="sgd", momentum=0.9) == 10 * 12
    assert training_state_bytes(10, device_type="cpu", optimizer="sgd", momentum=0.0) == 10 * 8
    assert training_state_bytes(10, device_type="cuda", optimizer="adamw") == 40


def test_a_model_that_fits_passes(monkeypatch):
    monkeypatch.setattr(host_memory, "host_memory", lambda: (23 * GIB, 20 * GIB))
    check_fits(1_000_000, device_type="cpu")
    with pytest.raises(ValueError, match="KILN_SKIP_MEMORY_CHECK"):
        check_fits(8_000_000_000, device_type="cuda")
    monkeypatch.setenv("KILN_SKIP_MEMORY_CHECK", "1")
    check_fits(8_000_000_000, device_type="cuda")


def test_host_oom_advice_blames_a_huge_model_first(monkeypatch):
    monkeypatch.setattr(host_memory, "host_memory", lambda: (23 * GIB, 1 * GIB))
    cfg = load_config(None, ["training.device=cpu"])
    error = RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                         "you tried to allocate 4294967296 bytes")
    advice = diagnose(error, cfg=cfg, model_params=1_000_000_000).advice
    assert advice.startswith("the failed allocation asked for 4.0 GiB; the model's 1000.0M parameters hold 14.9 GiB")
    assert advice.index("the model itself is the bulk") < advice.index("data.batch_size")
    small = diagnose(MemoryError(), cfg=cfg, model_params=1000).advice
    assert "the model itself" not in small and "data.batch_size" in small
