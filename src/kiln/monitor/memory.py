"""Peak memory of the run: the CUDA caching allocator's peaks, or the process's peak RSS on CPU.

Both read host-side counters, so calling them at a log step costs no device synchronisation.
"""

from __future__ import annotations

import sys

import torch

__all__ = ["max_rss_bytes", "memory_stats", "reset_peak"]


def max_rss_bytes() -> int | None:
    """Peak resident set size of this process (lifetime high-water mark), or None where unknown."""
    try:
        import resource
    except ImportError:  # Windows has no `resource` module
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # getrusage(2): Linux reports ru_maxrss in KiB, macOS in bytes.
    return int(rss) if sys.platform == "darwin" else int(rss) * 1024


def memory_stats(device: torch.device | str) -> dict[str, int | None]:
    """Peak memory since the last `reset_peak`.

    Keys: `max_allocated_bytes` and `max_reserved_bytes` (CUDA allocator; None off CUDA),
    `max_rss_bytes` (host process, always), and `peak_mem_bytes`, the one figure summary.json
    reports: allocated on CUDA (what tensors actually needed), RSS elsewhere.
    """
    dev = torch.device(device)
    rss = max_rss_bytes()
    if dev.type == "cuda":
        allocated = int(torch.cuda.max_memory_allocated(dev))
        reserved = int(torch.cuda.max_memory_reserved(dev))
        return {
            "max_allocated_bytes": allocated,
            "max_reserved_bytes": reserved,
            "max_rss_bytes": rss,
            "peak_mem_bytes": allocated,
        }
    return {
        "max_allocated_bytes": None,
        "max_reserved_bytes": None,
        "max_rss_bytes": rss,
        "peak_mem_bytes": rss,
    }


def reset_peak(device: torch.device | str) -> None:
    """Start a new peak window (e.g. after warm-up/compile). No-op on CPU: ru_maxrss cannot be reset."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
