"""Bind this process to the CPU cores nearest its GPU (seed 000's topology-aware placement).

NVML reports, per GPU, the CPU set of its NUMA node (`nvmlDeviceGetCpuAffinity`); pinning the
process there keeps host-to-device copies and the data loader on local memory.
"""

from __future__ import annotations

import os

import torch

from kiln.monitor.nvml import NVML_HINT, device_handle, import_nvml


def bind_to_gpu_numa_node(device: torch.device) -> str:
    """Pin this process; returns a line saying what was done (or why nothing was)."""
    if device.type != "cuda":
        return "bind_numa: CPU run, nothing to bind"
    pynvml = import_nvml()
    if pynvml is None:
        return f"bind_numa: {NVML_HINT}; not binding"
    pynvml.nvmlInit()
    try:
        handle = device_handle(pynvml, device)
        words = (os.cpu_count() + 63) // 64
        mask = pynvml.nvmlDeviceGetCpuAffinity(handle, words)
    finally:
        pynvml.nvmlShutdown()
    cpus = {word * 64 + bit for word, bits in enumerate(mask) for bit in range(64) if bits >> bit & 1}
    cpus &= set(range(os.cpu_count() or 1))
    if not cpus:
        return "bind_numa: NVML reported no CPU affinity; not binding"
    os.sched_setaffinity(0, cpus)
    return f"bind_numa: {device} pinned to {len(cpus)} CPUs ({min(cpus)}-{max(cpus)})"
