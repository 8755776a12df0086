"""Datasheet peaks of common GPUs, looked up by the name CUDA reports, with the document they come from.

A measured ceiling says what this machine reaches today; the datasheet says what the part is sold
as. kiln reports a figure against both, so a reader can tell "close to what the hardware can do"
from "close to what one benchmark kernel did". Figures are *dense* (no 2:4 sparsity) tensor-core
rates and peak memory bandwidth, in the units the datasheets use (TFLOP/s, TB/s, 10^12).

`fp32` is the CUDA-core rate; `tf32` the tensor-core rate fp32 matmuls get when TF32 is allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    name: str
    """The part, as its datasheet names it."""
    source: str
    """The datasheet the figures are from."""
    tflops: dict[str, float]
    """Dense peak TFLOP/s by matrix-unit dtype: `fp32`, `tf32`, `bf16`, `fp16`."""
    bandwidth_tbs: float
    """Peak memory bandwidth in TB/s (10^12 bytes/s)."""

    def flops_per_s(self, dtype: str) -> float | None:
        value = self.tflops.get(dtype)
        return value * 1e12 if value is not None else None

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_tbs * 1e12


def _spec(name: str, source: str, fp32: float, tf32: float, bf16: float, bandwidth_tbs: float) -> GpuSpec:
    return GpuSpec(name, source, {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": bf16}, bandwidth_tbs)


_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet"

# (pattern over the CUDA device name, spec); the first match wins, so specific names come first.
SPECS: tuple[tuple[str, GpuSpec], ...] = (
    (r"H100.*NVL", _spec("H100 NVL", _H100, 60.0, 417.5, 835.0, 3.9)),
    (r"H100.*PCIe", _spec("H100 PCIe", _H100, 51.2, 378.0, 756.0, 2.0)),
    (r"H100", _spec("H100 SXM5", _H100, 66.9, 494.7, 989.4, 3.35)),
    (r"H200.*NVL", _spec("H200 NVL", _H200, 60.0, 417.5, 835.0, 4.8)),
    (r"H200", _spec("H200 SXM", _H200, 67.0, 494.5, 989.0, 4.8)),
    (r"A100.*SXM.*80GB", _spec("A100 SXM4 80GB", _A100, 19.5, 156.0, 312.0, 2.039)),
    (r"A100.*80GB", _spec("A100 PCIe 80GB", _A100, 19.5, 156.0, 312.0, 1.935)),
    (r"A100", _spec("A100 40GB", _A100, 19.5, 156.0, 312.0, 1.555)),
    (r"L40S", _spec("L40S", "NVIDIA L40S GPU datasheet", 91.6, 183.0, 362.05, 0.864)),
    (r"\bL4\b", _spec("L4", "NVIDIA L4 Tensor Core GPU datasheet", 30.3, 60.0, 121.0, 0.3)),
    (r"\bA10\b", _spec("A10", "NVIDIA A10 Tensor Core GPU datasheet", 31.2, 62.5, 125.0, 0.6)),
)


def lookup(device_name: str | None) -> GpuSpec | None:
    """The datasheet entry for a CUDA device name (`torch.cuda.get_device_name`), or None."""
    if not device_name:
        return None
    for pattern, spec in SPECS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return spec
    return None


def spec_dtype(matmul_dtype: str, tf32: bool) -> str:
    """The datasheet column for a matmul dtype name (`float32` runs on TF32 tensor cores when allowed)."""
    name = matmul_dtype.removeprefix("torch.")
    if name in ("bfloat16", "bf16"):
        return "bf16"
    if name in ("float16", "fp16"):
        return "fp16"
    return "tf32" if tf32 else "fp32"
