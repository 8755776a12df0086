"""A read-only streaming kernel in Triton: the bandwidth ceiling of work that only reads memory.

One program per contiguous block of the buffer: it loads the block's 64-bit words, xors them
together and writes one word, so the kernel reads every byte once and writes 1/BLOCK of that
(0.02 %): what a decode step's weight reads look like to the memory system. torch's reductions
do the same work with more arithmetic per byte; kiln.bench.ceilings keeps whichever is fastest.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch kernels still measure
    triton = None

BLOCK = 4096
"""64-bit words per program (32 KiB)."""

if triton is not None:

    @triton.jit
    def _xor_block(src, out, n_words, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        words = tl.load(src + offs, mask=offs < n_words, other=0)
        tl.store(out + pid, tl.xor_sum(words, 0))


def triton_read(buf: torch.Tensor, block: int = BLOCK, warps: int = 8) -> Callable[[], torch.Tensor] | None:
    """A callable streaming all of `buf` (uint8, length a multiple of 8) and returning one xor per
    `block` words, or None where Triton is not installed."""
    if triton is None:
        return None
    words = buf.view(torch.int64)
    n = words.numel()
    programs = -(-n // block)
    out = torch.empty(programs, dtype=torch.int64, device=buf.device)

    def run() -> torch.Tensor:
        _xor_block[(programs,)](words, out, n, BLOCK=block, num_warps=warps)
        return out

    return run
