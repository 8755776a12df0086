"""Datasheet peaks of a GPU, looked up by the name CUDA reports: dense FLOP/s and memory bandwidth.

A measured ceiling says what this machine reaches today; the datasheet says what the part is sold
as. kiln reports a figure against both, so a reader can tell "close to what the hardware can do"
from "close to what one benchmark kernel did". FLOP/s come from the table MFU uses
(kiln.monitor.flops: dense tensor-core rates, sparse datasheet figures halved); this module adds
each part's peak memory bandwidth and names the document both come from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kiln.monitor.flops import peak_flops_for_name


@dataclass(frozen=True)
class GpuSpec:
    name: str
    """The part, as its datasheet names it."""
    source: str
    """The datasheet the figures are from."""
    bandwidth_tbs: float
    """Peak memory bandwidth in TB/s (10^12 bytes/s)."""
    device_name: str
    """The CUDA device name this entry was looked up for."""

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_tbs * 1e12

    def flops_per_s(self, dtype: str) -> float | None:
        """Dense peak FLOP/s at a matrix-unit dtype (`bf16`, `fp16`, `tf32`, `fp32`)."""
        return table_flops(self.device_name, dtype)


def table_flops(device_name: str, dtype: str) -> float | None:
    """kiln.monitor.flops' dense peak for a device name at a matrix-unit dtype, or None."""
    policy, tf32 = {"bf16": ("bf16-true", False), "fp16": ("fp16-mixed", False), "tf32": ("fp32", True),
                    "fp32": ("fp32", False)}[dtype]
    return peak_flops_for_name(device_name, policy, tf32=tf32)[0]


_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet"

# (pattern over the lower-cased device name, bounded by non-alphanumerics; part; TB/s; source).
# The first match wins, so the more specific names come first.
BANDWIDTH: tuple[tuple[str, str, float, str], ...] = (
    (r"h200 nvl", "H200 NVL", 4.8, _H200),
    (r"h200", "H200 SXM", 4.8, _H200),
    (r"h100 nvl", "H100 NVL", 3.9, _H100),
    (r"h100 pcie", "H100 PCIe", 2.0, _H100),
    (r"h100", "H100 SXM5", 3.35, _H100),
    (r"b200", "HGX B200", 8.0, "NVIDIA HGX B200 specifications"),
    (r"a100.*sxm.*80gb", "A100 SXM4 80GB", 2.039, _A100),
    (r"a100.*80gb", "A100 PCIe 80GB", 1.935, _A100),
    (r"a100", "A100 40GB", 1.555, _A100),
    (r"a10g", "A10G", 0.6, "AWS EC2 G5 instance specifications"),
    (r"a10", "A10", 0.6, "NVIDIA A10 Tensor Core GPU datasheet"),
    (r"l40s", "L40S", 0.864, "NVIDIA L40S GPU datasheet"),
    (r"l40", "L40", 0.864, "NVIDIA L40 GPU datasheet"),
    (r"l4", "L4", 0.3, "NVIDIA L4 Tensor Core GPU datasheet"),
    (r"rtx 4090", "RTX 4090", 1.008, "NVIDIA Ada GPU architecture whitepaper"),
    (r"v100", "V100", 0.9, "NVIDIA V100 Tensor Core GPU datasheet"),
)


def lookup(device_name: str | None) -> GpuSpec | None:
    """The datasheet entry for a CUDA device name (`torch.cuda.get_device_name`), or None."""
    if not device_name:
        return None
    lowered = device_name.lower()
    for pattern, part, tbs, source in BANDWIDTH:
        if re.search(rf"(?<![a-z0-9]){pattern}(?![a-z0-9])", lowered):
            return GpuSpec(part, source, tbs, device_name)
    return None


def spec_dtype(matmul_dtype: str, tf32: bool) -> str:
    """The datasheet column for a matmul dtype name (`float32` runs on TF32 tensor cores when allowed)."""
    name = matmul_dtype.removeprefix("torch.")
    if name in ("bfloat16", "bf16"):
        return "bf16"
    if name in ("float16", "fp16"):
        return "fp16"
    return "tf32" if tf32 else "fp32"
