"""A sequence tagger: embeddings, a bidirectional GRU, a linear tag head."""

from __future__ import annotations

import torch
import torch.nn as nn


class Tagger(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 16, tags: int = 5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * dim, tags)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        h, _ = self.rnn(h)
        return self.head(h)


def build():
    torch.manual_seed(0)
    return Tagger(), torch.randint(0, 50, (4, 12))
