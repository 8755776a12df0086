"""Hardware ceilings measured on the spot: device-to-device copy bandwidth and matmul FLOP/s.

Datasheet peaks are not what a kernel can reach on this machine today (clocks, ECC, power caps,
another tenant), so benchmarks compare against what the same device does at the same moment:
- bandwidth: `dst.copy_(src)` of a buffer far larger than the L2 cache, counting the bytes read
  plus the bytes written (a memory-bound kernel's own accounting);
- matmul: a square matmul in the benchmark's dtype, 2·n³ FLOPs per call.
Both go through the shared timing helper (warm-up, synchronize, median).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from kiln.bench.timing import measure


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float
    """Bytes read + written per second by a device-to-device copy."""
    matmul_flops_per_s: float
    """FLOP/s of an n x n x n matmul in `dtype`."""
    copy_bytes: int
    """Size of the copied buffer."""
    matmul_n: int
    dtype: str
    device: str

    def as_dict(self) -> dict:
        return asdict(self)


def _default_sizes(device: torch.device) -> tuple[int, int]:
    # GPU: 1 GiB (far beyond any L2) and an 8192³ matmul (tensor cores saturated). CPU: small
    # enough for a test to measure in well under a second.
    return (1 << 30, 8192) if device.type == "cuda" else (64 << 20, 512)


def measure_copy_bandwidth(device: torch.device | str, nbytes: int | None = None, repeats: int = 20) -> float:
    """Bytes/s (read + written) of a device-to-device copy of `nbytes`."""
    dev = torch.device(device)
    nbytes = nbytes or _default_sizes(dev)[0]
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    timing = measure(lambda: dst.copy_(src), warmup=3, repeats=repeats, device=dev)
    return 2 * nbytes / timing.median_s


def measure_matmul_flops(device: torch.device | str, dtype: torch.dtype = torch.bfloat16, n: int | None = None,
                         repeats: int = 20) -> float:
    """FLOP/s of an n³ matmul in `dtype`."""
    dev = torch.device(device)
    n = n or _default_sizes(dev)[1]
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    out = torch.empty(n, n, device=dev, dtype=a.dtype)
    timing = measure(lambda: torch.mm(a, b, out=out), warmup=3, repeats=repeats, device=dev)
    return 2 * n**3 / timing.median_s


def measure_ceilings(device: torch.device | str, dtype: torch.dtype = torch.bfloat16, *, copy_bytes: int | None = None,
                     matmul_n: int | None = None) -> Ceilings:
    dev = torch.device(device)
    default_bytes, default_n = _default_sizes(dev)
    copy_bytes, matmul_n = copy_bytes or default_bytes, matmul_n or default_n
    bandwidth = measure_copy_bandwidth(dev, copy_bytes)
    flops = measure_matmul_flops(dev, dtype, matmul_n)
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # hand the 2 GiB of copy buffers back before the models load
    return Ceilings(bandwidth, flops, copy_bytes, matmul_n, str(dtype).removeprefix("torch."), str(dev))


def matmul_dtype(policy: str, tf32: bool) -> torch.dtype:
    """The matrix-unit precision a precision policy runs its matmuls in (fp32 runs on the TF32
    tensor cores on CUDA when `tf32` is allowed, which the caller's tf32 setting decides)."""
    if policy.startswith("bf16"):
        return torch.bfloat16
    if policy.startswith("fp16"):
        return torch.float16
    return torch.float32
