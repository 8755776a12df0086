"""NVML (nvidia-ml-py, the `gpu` extra) access shared by GPU health sampling and NUMA binding."""

from __future__ import annotations

from typing import Any

import torch

NVML_HINT = "nvidia-ml-py is not installed (pip install 'kiln[gpu]')"


def import_nvml() -> Any | None:
    """The `pynvml` module (shipped by nvidia-ml-py), or None when it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def device_handle(pynvml: Any, device: torch.device) -> Any:
    """NVML handle of a CUDA device (NVML must be initialised). Matched by PCI address: NVML
    indexes all GPUs, torch only those CUDA_VISIBLE_DEVICES shows."""
    props = torch.cuda.get_device_properties(device)
    if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        address = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        return pynvml.nvmlDeviceGetHandleByPciBusId(address)
    return pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
