"""Per-row next-token choice for a batch whose rows belong to different requests.

`kiln.llm.sampling.sample` takes one setting for the whole batch and draws its noise from torch's
global generator, so a request's tokens would depend on which others share its batch. Here every
row has its own temperature (0 = greedy), top-k, top-p and seed in device tensors, and the noise of
the exponential race is a hash of (seed, position, token id): a seeded request gives the same text
whatever else runs beside it, and nothing syncs with the host or recompiles when settings change.

Top-k and top-p keep the tokens whose probability is at least a threshold per row. Eagerly the
threshold is read off a sort of the vocabulary; compiled (the server's decode step) it is searched
for instead (`keep_threshold`): the largest fp32 bit pattern whose count (top-k), then mass (top-p,
within the top-k), of tokens at or above it still reaches the target, 4 bits per pass over the
vocabulary, 16 passes of fused reductions instead of a sort of every row's whole vocabulary (what
cost most of a sampled step's sampling). Both keep the same tokens, ties at the threshold aside
(kept whole), and the race's noise is keyed by token id, so both draw the same token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kiln.llm.sampling import argmax, cumsum_short_scans

_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # splitmix64's constants as signed int64
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def hashed_uniform(seed: Tensor, position: Tensor, vocab: int) -> Tensor:
    """Uniform (0, 1) floats [B, vocab], a pure function of (seed[b], position[b], token id):
    splitmix64's mixing on int64 (wrapping products, arithmetic shifts), 24 bits kept."""
    ids = torch.arange(vocab, device=seed.device, dtype=torch.long).view(1, -1)
    z = (seed.view(-1, 1) * _GOLDEN + position.view(-1, 1)) * _GOLDEN + ids
    z = (z ^ (z >> 30)) * _MIX1
    z = (z ^ (z >> 27)) * _MIX2
    z = z ^ (z >> 31)
    return (((z >> 20) & 0xFFFFFF).float() + 0.5) / float(1 << 24)


SEARCH_WAYS = 16
"""Sub-intervals per search pass: 15 candidate thresholds, 4 bits of the answer per pass."""
_SEARCH_PASSES = 8
"""Passes that shrink [0, 2^31) to one bit pattern at 4 bits each."""


def _largest_reaching(bits: Tensor, weight: Tensor, target: Tensor, lo: Tensor) -> Tensor:
    """Per row, the largest b >= lo with sum(weight where bits >= b) >= target (which holds at lo):
    bit patterns of non-negative floats order as their values, so it is the value of a token."""
    hi = torch.full_like(lo, 1 << 31)  # no positive float's pattern reaches it: fails
    steps = torch.arange(1, SEARCH_WAYS, device=bits.device)
    for _ in range(_SEARCH_PASSES):
        cands = lo[:, None] + ((hi - lo)[:, None] * steps + SEARCH_WAYS - 1) // SEARCH_WAYS
        # one sum per candidate over the same rows: inductor fuses them into one pass over the vocabulary
        sums = torch.stack([torch.where(bits >= cands[:, i:i + 1], weight, 0).sum(-1)
                            for i in range(SEARCH_WAYS - 1)], -1)
        ok = sums >= target[:, None]
        lo = torch.maximum(lo, torch.where(ok, cands, lo[:, None]).amax(-1))
        hi = torch.minimum(hi, torch.where(ok, hi[:, None], cands).amin(-1))
    return lo


def keep_threshold(probs: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Per row of `probs` [B, vocab] (fp32, >= 0), the fp32 bit pattern [B] (int64) from which a token
    is kept: the k-th largest probability (top_k 0: all), then within those the smallest probability
    whose tokens at or above it hold top_p of their mass (top_p 1: all of them), by search."""
    bits = probs.view(torch.int32)
    vocab = probs.shape[-1]
    zero = torch.zeros(probs.shape[0], dtype=torch.long, device=probs.device)
    count = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab).to(probs.dtype)
    from_k = _largest_reaching(bits, torch.ones_like(probs), count, zero)
    inside = torch.where(bits >= from_k[:, None], probs, 0.0)
    from_p = _largest_reaching(bits, inside, top_p * inside.sum(-1), from_k)
    return torch.where(top_p < 1, from_p, from_k)


def pick_tokens(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor,
                position: Tensor, greedy_only: bool) -> Tensor:
    """Next token per row of `logits` [B, vocab] fp32. Per-row [B] settings: temperature 0 is the
    argmax, top_k 0 and top_p 1 are off; `position` [B] is the position of the token being chosen.
    `greedy_only`: every row is greedy (one argmax, no sampling)."""
    best = argmax(logits)
    if greedy_only:
        return best
    vocab = logits.shape[-1]
    warm = temperature > 0
    probs = torch.softmax(logits / torch.where(warm, temperature, 1.0).view(-1, 1), dim=-1)
    if torch.compiler.is_compiling():  # fused reductions, no sort
        keep = probs.view(torch.int32) >= keep_threshold(probs, top_k, top_p)[:, None]
    else:
        keep = _kept_by_sort(probs, top_k, top_p)
    noise = -torch.log(hashed_uniform(seed, position, vocab))  # Exp(1), per (row, position, token)
    drawn = (torch.where(keep, probs, 0.0) / noise).argmax(dim=-1)
    return torch.where(warm, drawn, best)


def _kept_by_sort(probs: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """`keep_threshold`'s tokens [B, vocab] (bool) read off a descending sort: those at least as likely
    as the top_k-th, then while the mass before a token (renormalised over them) is under top_p (the
    first always stays; top_p 1 keeps them all), and every token as likely as the last one kept."""
    vocab = probs.shape[-1]
    ordered, _ = probs.sort(dim=-1, descending=True)
    kth = ordered.gather(-1, (torch.where(top_k > 0, top_k.clamp(max=vocab), vocab) - 1).view(-1, 1))
    ordered = torch.where(ordered >= kth, ordered, 0.0)
    mass = ordered / ordered.sum(-1, keepdim=True)
    before = cumsum_short_scans(mass) - mass
    kept = ((before < top_p.view(-1, 1)) | (top_p.view(-1, 1) >= 1)) & (ordered >= kth)
    last = torch.where(kept, ordered, float("inf")).amin(-1, keepdim=True)
    return probs >= last
