"""Per-row next-token choice for a batch whose rows belong to different requests.

`kiln.llm.sampling.sample` takes one setting for the whole batch and draws its noise from torch's
global generator, so a request's tokens would depend on which others share its batch. Here every
row has its own temperature (0 = greedy), top-k, top-p and seed in device tensors, and the noise of
the exponential race is a hash of (seed, position, token id): a seeded request gives the same text
whatever else runs beside it, and nothing syncs with the host or recompiles when settings change.
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


def pick_tokens(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor,
                position: Tensor, greedy_only: bool) -> Tensor:
    """Next token per row of `logits` [B, vocab] fp32. Per-row [B] settings: temperature 0 is the
    argmax, top_k 0 and top_p 1 are off; `position` [B] is the position of the token being chosen.
    `greedy_only`: every row is greedy (one argmax, no sort)."""
    best = argmax(logits)
    if greedy_only:
        return best
    vocab = logits.shape[-1]
    warm = temperature > 0
    scaled = logits / torch.where(warm, temperature, 1.0).view(-1, 1)
    ordered, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device).view(1, -1)
    keep_k = torch.where(top_k > 0, top_k, vocab).view(-1, 1)
    ordered = ordered.masked_fill(rank >= keep_k, float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    mass_before = cumsum_short_scans(probs) - probs
    probs = probs.masked_fill(mass_before >= top_p.view(-1, 1), 0.0)  # the most likely token always stays
    noise = -torch.log(hashed_uniform(seed, position, vocab))  # Exp(1), per (row, position, rank)
    race = probs / noise
    drawn = order.gather(-1, race.argmax(dim=-1, keepdim=True)).squeeze(-1)
    return torch.where(warm, drawn, best)
