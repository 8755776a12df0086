"""How many copies of a microbenchmark's operands to cycle through so they are read from memory.

A kernel replayed on the same few megabytes reads them from the L2 cache after the first call (an
H100 holds 50 MiB), which measures the cache, not the memory a model's layers stream from. A
microbenchmark therefore cycles over enough distinct copies that one pass reads `factor` times the
L2 size before it comes back to the first copy (benchmarks/matvec_bench.py,
decode_attention_bench.py, int4_matvec_bench.py).
"""

from __future__ import annotations

import torch

DEFAULT_L2_BYTES = 50 * 2**20
"""The H100's L2, for devices that do not report theirs."""


def l2_bytes(device: torch.device | str | None = None) -> int:
    """The device's L2 cache size (CUDA reports it), else DEFAULT_L2_BYTES."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0)
        if size:
            return int(size)
    return DEFAULT_L2_BYTES


def copies_beyond_l2(nbytes: int, l2: int = DEFAULT_L2_BYTES, *, factor: int = 3, at_least: int = 2) -> int:
    """Copies of an operand of `nbytes` whose one pass reads at least `factor` x `l2` bytes
    (never fewer than `at_least`)."""
    if nbytes <= 0:
        raise ValueError(f"nbytes must be > 0, got {nbytes}")
    return max(at_least, -(-factor * l2 // nbytes))
