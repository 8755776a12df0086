"""The two ceilings of a device, measured on the spot (METHOD.md: datasheet rates are leads).

- `copy_bandwidth`: a large device-to-device copy, counting bytes read plus bytes written: the
  rate memory-bound work (batch-1 decoding, optimizer updates) can reach at best.
- `matmul_peak`: a large square matrix product through the library torch uses, on random data
  (zeros run faster than real data): the rate compute-bound work can reach at best.

Both go through kiln's one timing helper (warm-up, synchronize, median of repeats). On a CPU
they are measured the same way on smaller sizes, which is enough to report a fraction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kiln.bench.timing import measure


@dataclass(frozen=True)
class Ceiling:
    value: float
    """bytes/s for bandwidth, FLOP/s for a matmul peak."""
    how: str
    """What was measured, for the results' environment block."""


def copy_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 20) -> Ceiling:
    """Bytes read + written per second of a device-to-device copy of `nbytes` (default: 1 GiB on
    CUDA, 64 MiB on CPU: well past any cache)."""
    device = torch.device(device)
    nbytes = nbytes or (2**30 if device.type == "cuda" else 2**26)
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    timing = measure(lambda: dst.copy_(src), warmup=3, repeats=repeats, device=device)
    moved = 2 * src.numel() * src.element_size()
    return Ceiling(moved / timing.median_s, f"copy of {nbytes / 2**20:.0f} MiB, read+write, median of {repeats}")


def matmul_peak(device: torch.device, dtype: torch.dtype = torch.bfloat16, n: int | None = None,
                repeats: int = 20) -> Ceiling:
    """FLOP/s of an n x n x n matrix product in `dtype` (default n: 8192 on CUDA, 1024 on CPU)."""
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    timing = measure(lambda: torch.mm(a, b), warmup=3, repeats=repeats, device=device)
    name = str(dtype).removeprefix("torch.")
    return Ceiling(2 * n**3 / timing.median_s, f"{name} {n}x{n}x{n} matmul on random data, median of {repeats}")


def matmul_dtype(policy: str, tf32: bool) -> torch.dtype:
    """The matrix-unit precision a precision policy runs its matmuls in."""
    if policy.startswith("bf16"):
        return torch.bfloat16
    if policy.startswith("fp16"):
        return torch.float16
    return torch.float32  # with tf32 on CUDA, torch runs these on the TF32 tensor cores
