"""Choosing the next token on the device, without a host sync: greedy, or temperature/top-k/top-p.

The sampling parameters live in device tensors (kiln.llm.engine), so one compiled and captured
decode step serves every setting; only greedy vs sampled are two variants (greedy must be an
exact argmax). Sampling draws by an exponential race: argmax(p_i / E_i) with E_i ~ Exp(1) picks
token i with probability p_i (the Gumbel-max trick in another form), with no `multinomial` and
so no synchronisation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from kiln.errors import ConfigError


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    """0 is greedy (argmax); otherwise logits are divided by it before sampling."""
    top_k: int = 0
    """Sample among the k most likely tokens; 0 keeps all."""
    top_p: float = 1.0
    """Sample among the most likely tokens whose probabilities sum to at least top_p; 1 keeps all."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


FIELDS = ("temperature", "top_k", "top_p")


def check_sampling(sampling: Sampling, names: Mapping[str, str] | None = None) -> Sampling:
    """ConfigError naming the field (or its flag, through `names`) for an impossible setting."""
    name = {f: (names or {}).get(f, f) for f in FIELDS}
    if not sampling.temperature >= 0.0 or sampling.temperature == float("inf"):
        raise ConfigError(name["temperature"], f"must be a finite number >= 0 (0 = greedy), got {sampling.temperature}")
    if isinstance(sampling.top_k, bool) or not isinstance(sampling.top_k, int) or sampling.top_k < 0:
        raise ConfigError(name["top_k"], f"must be an integer >= 0 (0 = off), got {sampling.top_k!r}")
    if not 0.0 < sampling.top_p <= 1.0:
        raise ConfigError(name["top_p"], f"must be in (0, 1] (1 = off), got {sampling.top_p}")
    return sampling


ARGMAX_CHUNKS = 256
"""Chunks a long row is cut into for `argmax`."""


def argmax(logits: Tensor) -> Tensor:
    """logits.argmax(-1) of [B, vocab] in two reductions: each chunk's max, then the first chunk
    holding the row's max (so ties still go to the lowest index, as argmax's do). Compiled,
    inductor reduces a 128k-token row in one thread block per row, a visible share of a decode
    step in the profiles; cut in 256 chunks every block reduces ~500 values."""
    rows, vocab = logits.shape
    if vocab < 16 * ARGMAX_CHUNKS:
        return logits.argmax(dim=-1)
    per = -(-vocab // ARGMAX_CHUNKS)
    padded = torch.nn.functional.pad(logits, (0, per * ARGMAX_CHUNKS - vocab), value=float("-inf"))
    best, where = padded.view(rows, ARGMAX_CHUNKS, per).max(dim=-1)  # first max within each chunk
    chunk = best.argmax(dim=-1, keepdim=True)
    return (chunk * per + where.gather(-1, chunk)).squeeze(-1)


SCAN_CHUNK = 128
"""Longest scan `cumsum_short_scans` leaves to one cumsum call."""


def cumsum_short_scans(x: Tensor) -> Tensor:
    """x.cumsum(-1) as nested scans of at most SCAN_CHUNK elements (chunk sums, then a scan of the
    chunk totals, recursively). Inductor (torch 2.11, CUDA) turns one long scan over a few rows,
    e.g. [3, 16384], into a split scan whose code generation fails; short scans avoid it."""
    n = x.shape[-1]
    if n <= SCAN_CHUNK:
        return x.cumsum(dim=-1)
    chunks = -(-n // SCAN_CHUNK)
    padded = torch.nn.functional.pad(x, (0, chunks * SCAN_CHUNK - n))
    inner = padded.view(*x.shape[:-1], chunks, SCAN_CHUNK).cumsum(dim=-1)
    totals = inner[..., -1]
    before = cumsum_short_scans(totals) - totals
    return (inner + before.unsqueeze(-1)).flatten(-2)[..., :n]


def sample(logits: Tensor, greedy: bool, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Next token per row of `logits` [B, vocab] (fp32). `top_k` of 0 or `top_p` of 1 disable those."""
    if greedy:
        return argmax(logits)
    vocab = logits.shape[-1]
    ordered, order = (logits / temperature).sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)
    keep_k = torch.where(top_k > 0, top_k, vocab)
    ordered = ordered.masked_fill(rank >= keep_k, float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    mass_before = cumsum_short_scans(probs) - probs
    probs = probs.masked_fill(mass_before >= top_p, 0.0)  # the most likely token always stays
    race = probs / torch.empty_like(probs).exponential_(1.0)
    return order.gather(-1, race.argmax(dim=-1, keepdim=True)).squeeze(-1)
