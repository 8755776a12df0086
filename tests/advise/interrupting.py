"""A dataset that sends this process SIGINT (a user's Ctrl-C) when item 40 is read: in the middle of
the short profiled run `kiln advise` makes (data.num_workers=0 reads in the main process)."""

from __future__ import annotations

import os
import signal

import torch


class InterruptingDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int):
        if index == 40:
            os.kill(os.getpid(), signal.SIGINT)
        gen = torch.Generator().manual_seed(index)
        return torch.randn(64, generator=gen), index % 16


def interrupting_data():
    return InterruptingDataset()
