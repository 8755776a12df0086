"""kiln's top-k / top-p threshold for per-row sampling (kiln.serve.row_sampling), written in Triton.

Top-k and top-p keep the tokens whose probability is at least a threshold per row. Sorting each
row's vocabulary to find it (torch.sort: a segmented radix sort of every row's 128K probabilities)
took most of a sampled decode step's sampling. Here the threshold is searched for instead: bit
patterns of non-negative fp32 values order as the values, so the k-th largest probability is the
largest pattern b whose count of tokens at or above it still reaches k, and the top-p threshold is
the largest b (from the top-k one up) whose tokens at or above it hold top_p of the top-k tokens'
mass. Each pass splits a row's interval of patterns into 16 and counts (or weighs) the tokens at
or above the 15 inner candidates in one read of the row, spread over enough programs to fill the
GPU; 8 passes pin a 31-bit pattern, so a row takes 8 passes for top-k and 8 for top-p, 17 launches
in all (a row with top_k 0 or top_p 1 reads nothing in that search's passes). Ties at the threshold
are kept whole. A program sums its tiles lane by lane and across lanes once, at its end.

Each pass writes its programs' partial sums; every program of the next pass adds up its row's
partials in a fixed order (the same in each, so results do not depend on scheduling) and moves the
row's interval itself, and the first program of the row records it for the pass after. Tests run
the kernel on CPU through Triton's interpreter, against the sort.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kiln.kernels.triton_launch import interpreting

WAYS = 16
"""Sub-intervals per pass: 15 candidate thresholds beside the interval's low end."""
PASSES = 8
"""Passes per search: 16^8 > 2^31 patterns."""
TOP = 0x7F800001
"""Above the pattern of every non-negative float but NaN (+inf is 0x7F800000)."""
TARGET_PROGRAMS = 512
"""Programs per pass to aim for (rows x chunks of the vocabulary)."""
BLOCK_V = 512
"""Tokens per tile; a tile's [BLOCK_V, 16] comparisons stay in registers."""
NUM_WARPS = 4
"""With BLOCK_V and TARGET_PROGRAMS: the fastest of a sweep on an H200 at 1 and 32 rows."""


@triton.jit
def _candidates(lo, hi, j, WAYS: tl.constexpr):
    """The interval [lo, hi)'s candidates: lo itself (j = 0), then lo + ceil((hi - lo) j / WAYS)."""
    return lo + ((hi - lo) * j + WAYS - 1) // WAYS


def _search(P, TopK, TopP, Part, Lo, Hi, Target, FromK, Out, V, rows, chunks, chunk, stride_p, step,
            WAYS: tl.constexpr, PASSES: tl.constexpr, TOP: tl.constexpr, BLOCK_V: tl.constexpr,
            BLOCK_C: tl.constexpr):
    b = tl.program_id(0)
    c = tl.program_id(1)
    j = tl.arange(0, WAYS).to(tl.int64)
    lo = b.to(tl.int64) * 0
    hi = lo + TOP
    from_k = lo
    if step == 0:  # the top-k search: every pattern, the count of the top_k tokens (all of them for 0)
        k = tl.load(TopK + b).to(tl.int64)
        target = tl.where(k > 0, tl.minimum(k, V), V).to(tl.float32)
    else:  # move the interval by the last pass's sums: up to the highest candidate that reaches the target
        at = (step - 1) * rows + b
        lo = tl.load(Lo + at)
        hi = tl.load(Hi + at)
        target = tl.load(Target + at)
        cc = tl.arange(0, BLOCK_C)
        parts = tl.load(Part + (at * chunks + cc[:, None]) * WAYS + j[None, :], mask=(cc < chunks)[:, None], other=0.0)
        sums = tl.sum(parts, 0)  # in chunk order, the same in every program of the row
        if step == PASSES + 1:  # the first top-p pass weighed the top-k tokens' mass at candidate 0 (its lo)
            # (at least a tiny mass: top_p 0 keeps the most likely token)
            target = tl.maximum(tl.load(TopP + b) * tl.sum(tl.where(j == 0, sums, 0.0), 0), 1e-30)
        cands = _candidates(lo, hi, j, WAYS)
        ok = sums >= target
        new_lo = tl.maximum(lo, tl.max(tl.where(ok & (j > 0), cands, lo), 0))
        hi = tl.minimum(hi, tl.min(tl.where(ok | (j == 0), hi, cands), 0))
        lo = new_lo
        if step <= PASSES:  # top_k 0: every token, from pattern 0 (its passes summed nothing)
            lo = tl.where(tl.load(TopK + b) <= 0, lo * 0, lo)
        from_k = lo
        if step > PASSES:
            from_k = tl.load(FromK + b)
        if step == PASSES:  # the top-k threshold is found: the top-p search starts there
            hi = lo * 0 + TOP
            target = 0.0
    if step == 2 * PASSES:  # the answer (one program per row): top_p 1 keeps every top-k token
        tl.store(Out + b, tl.where(tl.load(TopP + b) >= 1.0, from_k, lo))
    else:
        if c == 0:
            tl.store(Lo + step * rows + b, lo)
            tl.store(Hi + step * rows + b, hi)
            tl.store(Target + step * rows + b, target)
            if step == PASSES:
                tl.store(FromK + b, from_k)
        cands = _candidates(lo, hi, j, WAYS).to(tl.int32)  # patterns are below 2^31
        weigh = step >= PASSES  # top-p: each token weighs its probability; top-k: 1
        # a row with top_k 0 keeps every token and one with top_p 1 every top-k token: no search
        skip = tl.where(weigh, tl.load(TopP + b) >= 1.0, tl.load(TopK + b) <= 0)
        end = tl.where(skip, c * chunk, tl.minimum(c * chunk + chunk, V))
        acc = tl.zeros([BLOCK_V, WAYS], dtype=tl.float32)  # summed over the tiles, then across lanes once
        for off in range(c * chunk, end, BLOCK_V):  # tokens loaded as [BLOCK_V, 1]: in the tile's own layout
            v = off + tl.arange(0, BLOCK_V)[:, None]
            m = v < end
            p = tl.load(P + b * stride_p + v, mask=m, other=0.0)
            bits = tl.where(m, p.to(tl.int32, bitcast=True), -1)
            w = tl.where(weigh, p, tl.where(m, 1.0, 0.0))
            acc += tl.where(bits >= cands[None, :], w, 0.0)
        acc = tl.sum(acc, 0)
        tl.store(Part + ((step * rows + b) * chunks + c) * WAYS + j, acc)


_KERNELS: dict[bool, object] = {}


def _kernel():
    """The jitted kernel (Triton picks its interpreter at jit time, so tests get an interpreted copy)."""
    interpret = interpreting()
    if interpret not in _KERNELS:
        _KERNELS[interpret] = triton.jit(_search, do_not_specialize=["step"])
    return _KERNELS[interpret]


def chunking(rows: int, vocab: int) -> tuple[int, int]:
    """(tokens per chunk, chunks per row): about TARGET_PROGRAMS programs, whole tiles each."""
    tiles = -(-vocab // BLOCK_V)
    per = -(-tiles // min(tiles, max(1, -(-TARGET_PROGRAMS // rows)))) * BLOCK_V
    return per, -(-vocab // per)


@torch.library.custom_op("kiln::keep_threshold", mutates_args=())
def keep_threshold(probs: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Per row of `probs` [B, vocab] (fp32, >= 0), the fp32 bit pattern [B] (int64) from which a token
    is kept: the top_k-th largest probability (top_k 0: every token), then within those the smallest
    probability whose tokens at or above it hold top_p of their mass (top_p 1: all of them; 0: the
    most likely token)."""
    probs = probs.contiguous()
    rows, vocab = probs.shape
    chunk, chunks = chunking(rows, vocab)
    dev = probs.device
    part = torch.empty(2 * PASSES, rows, chunks, WAYS, dtype=torch.float32, device=dev)
    lo, hi = (torch.empty(2 * PASSES, rows, dtype=torch.long, device=dev) for _ in range(2))
    target = torch.empty(2 * PASSES, rows, dtype=torch.float32, device=dev)
    from_k, out = (torch.empty(rows, dtype=torch.long, device=dev) for _ in range(2))
    args = (probs, top_k.contiguous(), top_p.to(torch.float32).contiguous(), part, lo, hi, target, from_k, out,
            vocab, rows, chunks, chunk, probs.stride(0))
    consts = {"WAYS": WAYS, "PASSES": PASSES, "TOP": TOP, "BLOCK_V": BLOCK_V,
              "BLOCK_C": triton.next_power_of_2(chunks), "num_warps": NUM_WARPS}
    for step in range(2 * PASSES + 1):
        _kernel()[(rows, chunks if step < 2 * PASSES else 1)](*args, step, **consts)
    return out


@keep_threshold.register_fake
def _(probs, top_k, top_p):
    return probs.new_empty(probs.shape[0], dtype=torch.long)
