"""Bind this process to the CPU cores nearest its GPU (seed 000's topology-aware placement).

NVML reports, per GPU, the CPU set of its NUMA node (`nvmlDeviceGetCpuAffinity`); pinning the
process there keeps host-to-device copies and the data loader on local memory.
"""

from __future__ import annotations

import os

import torch


def bind_to_gpu_numa_node(device: torch.device) -> str:
    """Pin this process; returns a line saying what was done (or why nothing was)."""
    if device.type != "cuda":
        return "bind_numa: CPU run, nothing to bind"
    try:
        import pynvml
    except ImportError:
        return "bind_numa: nvidia-ml-py is not installed (pip install 'kiln[gpu]'); not binding"
    pynvml.nvmlInit()
    try:
        props = torch.cuda.get_device_properties(device)
        # Match by PCI address: NVML indexes all GPUs, torch only those CUDA_VISIBLE_DEVICES shows.
        if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            address = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(address)
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(device.index)
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
