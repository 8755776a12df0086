"""Per-row next-token choice for a batch whose rows belong to different requests.

`kiln.llm.sampling.sample` takes one setting for the whole batch and draws its noise from torch's
global generator, so a request's tokens would depend on which others share its batch. Here every
row has its own temperature (0 = greedy), top-k, top-p and seed in device tensors, and the noise of
the exponential race is a hash of (seed, position, token id): a seeded request gives the same text
whatever else runs beside it, and nothing syncs with the host or recompiles when settings change.

Top-k and top-p keep the tokens at least as likely as a threshold per row. On a GPU kiln's kernel
searches for it (kiln.kernels.triton_top: no sort of the vocabulary, which took most of a sampled
step's sampling); elsewhere it is read off a sort (`kept_by_sort`, also the kernel's reference).
Both keep ties at the threshold whole, and the race's noise is keyed by token id, so both draw the
same token.
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
    `greedy_only`: every row is greedy (one argmax, no sampling)."""
    best = argmax(logits)
    if greedy_only:
        return best
    vocab = logits.shape[-1]
    warm = temperature > 0
    probs = torch.softmax(logits / torch.where(warm, temperature, 1.0).view(-1, 1), dim=-1)
    if probs.is_cuda:
        import kiln.kernels.triton_top  # noqa: F401  (registers kiln::keep_threshold)

        keep = probs.view(torch.int32) >= torch.ops.kiln.keep_threshold(probs, top_k, top_p)[:, None]
    else:
        keep = kept_by_sort(probs, top_k, top_p)
    noise = -torch.log(hashed_uniform(seed, position, vocab))  # Exp(1), per (row, position, token)
    drawn = (torch.where(keep, probs, 0.0) / noise).argmax(dim=-1)
    return torch.where(warm, drawn, best)


def kept_by_sort(probs: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """The tokens [B, vocab] (bool) that top-k and top-p keep, read off a descending sort of `probs`
    [B, vocab]: those at least as likely as the top_k-th (top_k 0: all), then while the mass before
    a token, renormalised over them, is under top_p (the first always stays; top_p 1 keeps them all),
    and every token as likely as the last one kept."""
    vocab = probs.shape[-1]
    ordered, _ = probs.sort(dim=-1, descending=True)
    kth = ordered.gather(-1, (torch.where(top_k > 0, top_k.clamp(max=vocab), vocab) - 1).view(-1, 1))
    ordered = torch.where(ordered >= kth, ordered, 0.0)
    mass = ordered / ordered.sum(-1, keepdim=True)
    before = cumsum_short_scans(mass) - mass
    first = torch.arange(vocab, device=probs.device).view(1, -1) == 0
    kept = ((before < top_p.view(-1, 1)) | (top_p.view(-1, 1) >= 1) | first) & (ordered >= kth)
    last = torch.where(kept, ordered, float("inf")).amin(-1, keepdim=True)
    return probs >= last
