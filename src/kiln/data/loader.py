"""Host datasets (files, user code) streamed through a torch DataLoader onto the device.

Map-style datasets are sharded by `DistributedSampler(num_replicas=world_size, rank=rank,
seed=seed, drop_last=True)`: given explicit replicas and rank it needs no process group, works for
world_size=1, and its per-epoch order depends only on `seed + epoch` (`set_epoch`). Resuming at
`(epoch, index)` skips the first `index * batch_size` indices of that epoch's order, which yields
exactly the batches that would have followed, without reading the skipped samples.

Iterable datasets are sharded here, item by item: with R ranks and W workers, worker w of rank r
keeps items r*W + w, r*W + w + R*W, ... (so the dataset itself should not shard). Resuming them
re-reads and drops the skipped batches, and is exact only when the dataset's order is
deterministic (given `set_epoch(epoch)`, which is called when the dataset has it).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Sampler, get_worker_info

from kiln.config.schema import DataConfig
from kiln.data.base import DataSource, batches_per_epoch
from kiln.errors import ConfigError


class ResumableSampler(Sampler[int]):
    """DistributedSampler whose epoch can start `start` indices in."""

    def __init__(self, inner: DistributedSampler):
        self.inner = inner
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.inner), self.start, None)

    def __len__(self) -> int:
        return max(0, len(self.inner) - self.start)


class RankShardedIterable(IterableDataset):
    """Keeps this rank's and this worker's share of an iterable dataset's items."""

    def __init__(self, inner: IterableDataset, rank: int, world_size: int):
        self.inner, self.rank, self.world_size = inner, rank, world_size

    def set_epoch(self, epoch: int) -> None:
        if callable(getattr(self.inner, "set_epoch", None)):
            self.inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        stride = self.world_size * workers
        return itertools.islice(iter(self.inner), self.rank * workers + worker, None, stride)


class LoaderSource(DataSource):
    """A DataLoader made endless: epochs roll over with a new sampler order each time."""

    def __init__(
        self,
        dataset: Any,
        cfg: DataConfig,
        *,
        device: torch.device,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        tokens_per_batch: int | None = None,
    ):
        self.device = device
        self.iterable = isinstance(dataset, IterableDataset)
        workers = cfg.num_workers
        loader_kwargs: dict[str, Any] = {
            "batch_size": cfg.batch_size,
            "num_workers": workers,
            # Pinned host memory makes the .to(device, non_blocking=True) copy truly asynchronous;
            # it only exists for CUDA.
            "pin_memory": cfg.pin_memory and device.type == "cuda",
            "drop_last": cfg.drop_last,
        }
        if workers > 0:
            loader_kwargs["prefetch_factor"] = cfg.prefetch_factor
            # Workers of an iterable dataset hold their own copy of it, so set_epoch() in this
            # process would never reach persistent ones; map-style workers only receive indices.
            loader_kwargs["persistent_workers"] = not self.iterable
        per_epoch: int | None
        if self.iterable:
            self.sampler = None
            self.sharded = RankShardedIterable(dataset, rank, world_size)
            self.loader = DataLoader(self.sharded, **loader_kwargs)
            per_epoch = None
        else:
            inner = DistributedSampler(
                dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=True
            )
            self.sampler = ResumableSampler(inner)
            self.loader = DataLoader(dataset, sampler=self.sampler, **loader_kwargs)
            per_rank = len(inner)
            per_epoch = batches_per_epoch(per_rank, cfg.batch_size, cfg.drop_last)
            if per_epoch == 0:
                total = len(dataset) if isinstance(dataset, Sized) else "?"
                raise ConfigError(
                    "data.batch_size",
                    f"{cfg.batch_size} is more than the {per_rank} samples each of {world_size} rank(s) gets "
                    f"from {total}; lower it or set data.drop_last=false",
                )
        super().__init__(
            samples_per_batch=cfg.batch_size, tokens_per_batch=tokens_per_batch, batches_per_epoch=per_epoch
        )

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        while True:
            version, epoch, skip = self._version, self.epoch, self.index
            produced = 0
            for batch in self._epoch_batches(epoch, skip):
                produced += 1
                self.index += 1
                yield _to_device(batch, self.device)
                if self._version != version:  # load_state_dict() was called: jump there
                    break
            else:
                if produced == 0 and skip == 0:
                    raise ConfigError(
                        "data.source",
                        "the dataset produced no full batch in an epoch for this rank; "
                        "lower data.batch_size or set data.drop_last=false",
                    )
                self.epoch, self.index = epoch + 1, 0

    def _epoch_batches(self, epoch: int, skip: int) -> Iterator[Any]:
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)
            self.sampler.start = skip * self.samples_per_batch
            return iter(self.loader)
        self.sharded.set_epoch(epoch)
        return itertools.islice(iter(self.loader), skip, None)


def _to_device(batch: Any, device: torch.device) -> tuple[Tensor, Tensor]:
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise ConfigError("data.source", f"the dataset must yield (inputs, targets) pairs, got {type(batch).__name__}")
    inputs, targets = batch
    if not (isinstance(inputs, Tensor) and isinstance(targets, Tensor)):
        raise ConfigError(
            "data.source",
            f"the dataset must yield tensors, got ({type(inputs).__name__}, {type(targets).__name__})",
        )
    inputs = inputs.to(device, non_blocking=True)
    targets = targets.to(device, non_blocking=True)
    # Cast after the copy: the copy moves fewer bytes, and the cast runs on the device.
    if inputs.dtype == torch.float64:  # numpy's default dtype; models are float32
        inputs = inputs.float()
    if not targets.is_floating_point() and targets.dtype != torch.int64:  # class / token ids
        targets = targets.long()
    return inputs, targets
