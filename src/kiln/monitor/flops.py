"""FLOP counting, device peak FLOP/s and model FLOPs utilisation (MFU).

FLOPs are counted once, by running one real micro-batch step under
`torch.utils.flop_counter.FlopCounterMode`, instead of from a per-architecture formula: the count
then follows whatever model the user brings (timm, HF, their own). The counter sees matmuls,
convolutions and attention (the ops that dominate); elementwise ops count as zero, as in the usual
MFU definition (PaLM appendix B, torchtitan `get_num_flop_per_token`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["count_step_flops", "fake_copy", "mfu", "peak_flops", "peak_flops_for_name"]


def fake_copy(meta_module: nn.Module, device: torch.device | str):
    """`meta_module` (a model built on the meta device, given away: its tensors are replaced) made
    of fake tensors on `device`, and the FakeTensorMode to run it in. A step run there dispatches
    as on `device` (the same attention kernel, so the same count) while allocating nothing and
    computing nothing: an 8B model's FLOPs are counted without its 32 GB of fp32 weights, its
    gradients and an un-checkpointed forward at full length on the device."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        meta_module.to_empty(device=torch.device(device))
    return meta_module, mode


def count_step_flops(
    fn: Callable[[], Tensor],
    *,
    device: torch.device | str | None = None,
    module: nn.Module | None = None,
) -> int:
    """Run `fn` once (forward, loss, `.backward()` on one micro-batch) and return its FLOPs.

    The random stream is forked around the call (CPU plus the CUDA device in use), so dropout and
    other random ops inside `fn` leave the training run's RNG exactly where it was. If `module` is
    given, its buffers (BatchNorm running stats, counters) are restored afterwards for the same
    reason. Gradients are left accumulated: the caller zeros them.

    Notes for callers:
    - The count is for one micro-batch on this rank; multiply by `grad_accum_steps` for an
      optimizer step. Under DDP/FSDP each rank computes this for its own batch, so it pairs with
      per-device step time and per-device peak.
    - Count on the eager model before activation checkpointing: recomputed forwards would
      otherwise be counted, giving hardware FLOPs rather than model FLOPs.
    - Leaf inputs without `requires_grad` get no input-gradient matmul, so a Linear first layer
      costs 2x (not 3x) its forward FLOPs; that is real work saved, and the counter reflects it.
    """
    from torch.utils.flop_counter import FlopCounterMode

    devices, device_type = _rng_devices(device)
    saved = _snapshot_buffers(module) if module is not None else None
    # fork_rng restores the CPU state and the listed devices' states on exit; naming the device
    # explicitly avoids its warning (and its cost) of forking every visible GPU.
    with torch.random.fork_rng(devices=devices, device_type=device_type):
        with FlopCounterMode(display=False, custom_mapping=gqa_attention_formulas()) as counter:
            fn()
    if saved is not None and module is not None:
        _restore_buffers(module, saved)
    return int(counter.get_total_flops())


def _attention_flops(q, k, v) -> int:
    """q @ k^T and scores @ v over the query's heads: key/value heads (GQA) are broadcast."""
    b, h, s_q, d = q
    s_k, d_v = k[2], v[3]
    return 2 * b * h * s_q * d * s_k + 2 * b * h * s_q * s_k * d_v


def _attention_backward_flops(q, k, v) -> int:
    """Recomputed scores, then the gradients of v, the scores, q and k (torch's accounting)."""
    b, h, s_q, d = q
    s_k, d_v = k[2], v[3]
    return 2 * b * h * s_q * d * s_k + 2 * (2 * b * h * s_q * d_v * s_k) + 2 * (2 * b * h * s_q * s_k * d)


def gqa_attention_formulas() -> dict:
    """FLOP formulas for the fused SDPA ops that accept grouped-query attention (fewer key/value
    heads than query heads). torch >= 2.12 counts these itself; older releases (2.11 on our
    GPUs) assert equal head counts, which crashed FLOP counting of every GQA model (Llama 3,
    Qwen, Mistral) on CUDA. Empty where torch's own formula already handles GQA."""
    from torch.utils import flop_counter

    try:
        flop_counter.sdpa_flop_count((1, 2, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1))
    except AssertionError:  # this torch asserts equal head counts: supply kiln's formulas
        counts_gqa = False
    else:
        counts_gqa = True
    if counts_gqa:
        return {}
    aten = torch.ops.aten

    def forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return _attention_flops(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        return _attention_backward_flops(query, key, value)

    kinds = ("efficient", "flash", "cudnn")
    fwd = [getattr(aten, f"_scaled_dot_product_{k}_attention") for k in kinds
           if hasattr(aten, f"_scaled_dot_product_{k}_attention")]
    bwd = [getattr(aten, f"_scaled_dot_product_{k}_attention_backward") for k in kinds
           if hasattr(aten, f"_scaled_dot_product_{k}_attention_backward")]
    return {**dict.fromkeys(fwd, forward), **dict.fromkeys(bwd, backward)}


def _rng_devices(device: torch.device | str | None) -> tuple[list[int], str]:
    """The accelerator indices whose RNG state must be forked, and their device type."""
    if device is None:
        # Only touch CUDA if the process already uses it: initialising CUDA here would be a side
        # effect (and would break a later fork-based DataLoader worker that must not hold CUDA).
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return [torch.cuda.current_device()], "cuda"
        return [], "cuda"
    dev = torch.device(device)
    if dev.type == "cpu":
        return [], "cuda"
    if dev.type == "cuda":
        return [dev.index if dev.index is not None else torch.cuda.current_device()], "cuda"
    return [dev.index or 0], dev.type


def _snapshot_buffers(module: nn.Module) -> dict[str, Tensor]:
    return {name: buf.detach().clone() for name, buf in module.named_buffers()}


def _restore_buffers(module: nn.Module, saved: dict[str, Tensor]) -> None:
    with torch.no_grad():
        for name, buf in module.named_buffers():
            if name in saved:
                buf.copy_(saved[name])


# --------------------------------------------------------------------------------------------------
# Peak FLOP/s table.
#
# Dense (no 2:4 sparsity) tensor-core peaks per GPU, in FLOP/s, from the vendor datasheets; the
# datasheets print sparse figures with an asterisk, which are halved here. fp32 is the plain CUDA
# core rate (what fp32 matmuls reach without TF32). Sources:
#   H100 SXM/PCIe/NVL: https://www.nvidia.com/en-us/data-center/h100/ (H100 datasheet)
#   H200 (SXM, NVL):   https://www.nvidia.com/en-us/data-center/h200/
#   GH200:             https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/
#   B200 / GB200:      https://www.nvidia.com/en-us/data-center/hgx/ , .../gb200-nvl72/
#   A100:              nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (SXM and PCIe equal)
#   A10 (A10G):        a10-datasheet.pdf; AWS publishes no separate A10G tensor peaks, so the
#                      A10 figures are used (set metrics.peak_tflops if you know better)
#   L4, L40, L40S:     l4 / l40 / l40s datasheets and the Ada architecture whitepaper v2.1
#   RTX 4090:          Ada whitepaper (bf16/fp16 with fp32 accumulate, which PyTorch uses)
#   V100:              v100-datasheet (SXM2 and PCIe); no bf16 and no TF32 tensor cores
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _GpuPeak:
    label: str
    pattern: str  # regex matched against the lower-cased device name, bounded by non-alphanumerics
    bf16: float | None
    fp16: float
    tf32: float | None
    fp32: float


# Ordered: the first match wins, so the more specific names (H100 PCIe, GB200, L40S) come first.
_GPU_PEAKS: tuple[_GpuPeak, ...] = (
    _GpuPeak("GH200", r"gh200", 989.4e12, 989.4e12, 494.7e12, 66.9e12),
    _GpuPeak("H200 NVL", r"h200 nvl", 835.5e12, 835.5e12, 417.5e12, 60e12),
    _GpuPeak("H200", r"h200", 989.4e12, 989.4e12, 494.7e12, 66.9e12),
    _GpuPeak("H100 NVL", r"h100 nvl", 835.5e12, 835.5e12, 417.5e12, 60e12),
    _GpuPeak("H100 PCIe", r"h100 pcie", 756e12, 756e12, 378e12, 51.2e12),
    # "NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB", ...: the SXM part.
    _GpuPeak("H100 SXM", r"h100", 989.4e12, 989.4e12, 494.7e12, 66.9e12),
    _GpuPeak("GB200", r"gb200", 2500e12, 2500e12, 1250e12, 80e12),
    _GpuPeak("B200", r"b200", 2250e12, 2250e12, 1100e12, 80e12),
    _GpuPeak("A100", r"a100", 312e12, 312e12, 156e12, 19.5e12),
    _GpuPeak("A10G", r"a10g", 125e12, 125e12, 62.5e12, 31.2e12),
    _GpuPeak("A10", r"a10", 125e12, 125e12, 62.5e12, 31.2e12),
    _GpuPeak("L40S", r"l40s", 362.05e12, 362.05e12, 183e12, 91.6e12),
    _GpuPeak("L40", r"l40", 181e12, 181e12, 90.5e12, 90.5e12),
    _GpuPeak("L4", r"l4", 121e12, 121e12, 60e12, 30.3e12),
    _GpuPeak("RTX 4090", r"rtx 4090", 165.2e12, 165.2e12, 82.6e12, 82.6e12),
    _GpuPeak("V100 PCIe", r"v100.*pcie", None, 112e12, None, 14e12),
    _GpuPeak("V100", r"v100", None, 125e12, None, 15.7e12),
)

_POLICIES = ("fp32", "bf16-mixed", "bf16-true", "bf16-master", "fp16-mixed")


def _lookup(name: str) -> _GpuPeak | None:
    lowered = name.lower()
    for entry in _GPU_PEAKS:
        # Bound the match so "A10" does not match "A100" and "L4" does not match "L40".
        if re.search(rf"(?<![a-z0-9]){entry.pattern}(?![a-z0-9])", lowered):
            return entry
    return None


def peak_flops_for_name(gpu_name: str, dtype_policy: str, *, tf32: bool = False) -> tuple[float | None, str]:
    """Table peak for a GPU name as `torch.cuda.get_device_name` reports it (testable without a GPU)."""
    if dtype_policy not in _POLICIES:
        raise ValueError(f"unknown precision policy {dtype_policy!r}; expected one of {', '.join(_POLICIES)}")
    entry = _lookup(gpu_name)
    if entry is None:
        return None, "unknown device"
    source = f"table:{entry.label}"
    if dtype_policy.startswith("bf16"):
        if entry.bf16 is None:
            return None, f"{source} (no bf16 tensor cores)"
        return entry.bf16, source
    if dtype_policy == "fp16-mixed":
        return entry.fp16, source
    # fp32: matmuls run on TF32 tensor cores only when the caller allowed it (precision.tf32) and
    # the GPU has them (Ampere+); otherwise the CUDA-core fp32 rate is the ceiling.
    if tf32 and entry.tf32 is not None:
        return entry.tf32, source
    return entry.fp32, source


def peak_flops(
    device: torch.device | str,
    dtype_policy: str,
    override_tflops: float = 0,
    *,
    tf32: bool = False,
) -> tuple[float | None, str]:
    """The FLOP/s ceiling for MFU on `device` under `dtype_policy`, and where it came from.

    Returns `(flops, source)`: source is "override" (`override_tflops` > 0, in TFLOP/s),
    "table:<GPU>" (kiln's table), or flops None with "unknown device" / "cpu". `tf32` should be the
    run's `precision.tf32` setting, which decides the fp32 ceiling on Ampere and newer.
    """
    if override_tflops and override_tflops > 0:
        return float(override_tflops) * 1e12, "override"
    dev = torch.device(device)
    if dev.type == "cpu":
        # CPU peaks depend on SKU, cores, clocks and AVX-512/AMX: no table can be right.
        return None, "cpu"
    if dev.type != "cuda" or torch.version.hip is not None:
        return None, "unknown device"
    return peak_flops_for_name(torch.cuda.get_device_name(dev), dtype_policy, tf32=tf32)


def mfu(flops_per_step: float, step_seconds: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the ceiling; None when it cannot be known."""
    if peak is None or peak <= 0 or step_seconds <= 0 or flops_per_step < 0:
        return None
    return flops_per_step / step_seconds / peak
