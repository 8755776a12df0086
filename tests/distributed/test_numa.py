"""NUMA binding reads the GPU's CPU affinity from NVML (faked here: no GPU on CI)."""

from __future__ import annotations

import sys
import types

import torch

from kiln.distributed import numa


def test_cpu_run_binds_nothing():
    assert "nothing to bind" in numa.bind_to_gpu_numa_node(torch.device("cpu"))


def test_binds_to_the_cpus_nvml_reports(monkeypatch):
    calls = {}
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByPciBusId=lambda address: calls.setdefault("address", address),
        nvmlDeviceGetHandleByIndex=lambda index: calls.setdefault("index", index),
        nvmlDeviceGetCpuAffinity=lambda handle, words: [0b1010] + [0] * (words - 1),  # CPUs 1 and 3
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    props = types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x1B, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(numa.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(numa.os, "sched_setaffinity", lambda pid, cpus: calls.setdefault("cpus", set(cpus)))
    line = numa.bind_to_gpu_numa_node(torch.device("cuda", 0))
    assert calls["address"] == "00000000:1b:00.0"
    assert calls["cpus"] == {1, 3}
    assert "2 CPUs" in line
