"""Synthetic data made once, on the training device, that a model can actually learn.

Why on the device: a benchmark must measure the model, not the input pipeline, so each step only
indexes a device-resident pool with a device-resident permutation (no host work, no host sync).
Why learnable: a falling loss is the cheapest end-to-end check that training works, so targets
come from a fixed random "teacher" rather than being noise:

- features (D,):    x ~ N(0, 1);  y = argmax(x @ W)  with a random W (D, classes);
- images (C, H, W): a low-resolution latent z (C, <=8, <=8) ~ N(0, 1) upsampled to H x W plus
                    pixel noise; y = argmax(flatten(z) @ W), so the class lives in coarse structure
                    and the teacher stays small whatever the image size;
- tokens (T,):      Markov chains of a random sparse bigram table (each token has 4 successors
                    with probabilities .4/.3/.2/.1); the entropy floor (~1.28 nats) is far below
                    log(vocab), and the targets are the window shifted by one.

Seeds: the teacher (W or bigram table) comes from `seed` only, so train and eval splits share the
task; the samples come from `(seed, split)`, so the eval split is different data from the same
distribution. Each epoch's order is a permutation seeded by `(seed, split, epoch)`.

Ranks follow `torch.utils.data.DistributedSampler`'s rule, so synthetic and file data shard alike:
every rank builds the same pool and the same per-epoch order, drops the tail that does not divide
by world_size, and rank r takes order[r::world_size]. Ranks are disjoint and their union is what
one process sees in that epoch.

Pool size: `data.synthetic_samples`, capped so the pool stays under ~512 MB (128 MB for eval):
3x224x224 float images are 602 KB each, so 4096 of them would be 2.4 GB of device memory. The
pool never drops below one batch per rank, whatever the cap or `synthetic_samples` say.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from kiln.config.schema import DataConfig
from kiln.data.base import (
    DataSource,
    InputSpecLike,
    batches_per_epoch,
    check_sample_shape,
    check_spec,
    derive_seed,
    resolve_seq_len,
)
from kiln.errors import ConfigError
from kiln.models.spec import CONTRACT_HINT

POOL_BYTES = {"train": 512 * 2**20, "eval": 128 * 2**20}
# Successor probabilities of the bigram table; cumulative form is what sampling needs.
_BIGRAM_PROBS = (0.4, 0.3, 0.2, 0.1)
_IMAGE_LATENT = 8
_IMAGE_NOISE = 0.5
_CHUNK_BYTES = 64 * 2**20  # images are generated in chunks so the temporaries stay small


def pool_size(requested: int, bytes_per_sample: int, batch_size: int, world_size: int, budget_bytes: int) -> int:
    """Samples in the synthetic pool: the request, capped by the memory budget, >= one batch per rank."""
    fits = budget_bytes // max(1, bytes_per_sample)
    return max(min(requested, fits), batch_size * world_size)


def _generator(device: torch.device, seed: int) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


class SyntheticSource(DataSource):
    """Device-resident learnable data; see the module docstring for the rules."""

    def __init__(
        self,
        cfg: DataConfig,
        spec: InputSpecLike | None,
        *,
        device: torch.device,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        split: str = "train",
    ):
        if spec is None:
            raise ConfigError(
                "data.source",
                "synthetic data needs the model's input shape, which this model does not give: "
                f"{CONTRACT_HINT}; or use data.source=files/tokens/imagefolder/module:function",
            )
        check_spec(spec)
        self.kind = spec.kind
        self.device = device
        self.seed = seed
        self.split = split
        self.rank = rank
        self.world_size = world_size
        # Eval passes should be comparable, so the eval split is never shuffled.
        self.shuffle = cfg.shuffle and split == "train"
        batch = cfg.batch_size

        if spec.kind == "tokens":
            if not spec.vocab_size or spec.vocab_size < 2:
                raise ConfigError("data.source", "synthetic tokens need the model's vocabulary size: return "
                                  "(model, token_ids) whose output is [batch, T, vocab], or declare vocab_size >= 2 "
                                  '(model, {"kind": "tokens", "shape": [T], "vocab_size": V})')
            self.seq_len = resolve_seq_len(cfg.seq_len, spec)
            check_sample_shape("data.seq_len", (self.seq_len,), spec)
            sample_bytes = (self.seq_len + 1) * 8
        else:
            if not spec.num_classes or spec.num_classes < 2:
                raise ConfigError("data.source", f"synthetic {spec.kind} need the number of classes (>= 2): return "
                                  "(model, example_inputs) whose output is [batch, classes], or declare num_classes "
                                  f'(model, {{"kind": "{spec.kind}", "shape": {list(spec.shape)}, "num_classes": C}})')
            want = 1 if spec.kind == "features" else 3
            if len(spec.shape) != want or min(spec.shape) < 1:
                raise ConfigError(
                    "model.name", f"{spec.kind} input shape must have {want} positive dims, got {spec.shape}"
                )
            self.seq_len = 0
            sample_bytes = 4 * _numel(spec.shape)

        self.num_samples = pool_size(cfg.synthetic_samples, sample_bytes, batch, world_size, POOL_BYTES[split])
        per_rank = self.num_samples // world_size
        super().__init__(
            samples_per_batch=batch,
            tokens_per_batch=batch * self.seq_len if spec.kind == "tokens" else None,
            batches_per_epoch=batches_per_epoch(per_rank, batch, cfg.drop_last),
        )

        teacher_gen = _generator(device, derive_seed(seed, "synthetic-teacher", spec.kind))
        data_gen = _generator(device, derive_seed(seed, "synthetic-samples", split))
        n = self.num_samples
        if spec.kind == "features":
            (dim,) = spec.shape
            teacher = torch.randn(dim, spec.num_classes, generator=teacher_gen, device=device) / dim**0.5
            self.inputs = torch.randn(n, dim, generator=data_gen, device=device)
            self.targets = (self.inputs @ teacher).argmax(dim=1)
        elif spec.kind == "images":
            self.inputs, self.targets = _make_images(
                n, tuple(spec.shape), spec.num_classes, teacher_gen, data_gen, device
            )
        else:
            self.inputs = _make_token_windows(n, self.seq_len + 1, spec.vocab_size, teacher_gen, data_gen, device)
            self.targets = self.inputs  # windows hold both; sliced per batch
        self._order_key: int | None = None
        self._order = torch.empty(0, dtype=torch.long, device=device)

    def _order_for(self, epoch: int) -> Tensor:
        """This rank's sample indices for `epoch`, on the device (cached for the current epoch)."""
        if self._order_key != epoch:
            n = self.num_samples
            if self.shuffle:
                gen = _generator(self.device, derive_seed(self.seed, "synthetic-order", self.split, epoch))
                order = torch.randperm(n, generator=gen, device=self.device)
            else:
                order = torch.arange(n, device=self.device)
            usable = n - n % self.world_size  # DistributedSampler(drop_last=True) rule
            self._order = order[self.rank : usable : self.world_size].contiguous()
            self._order_key = epoch
        return self._order

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        batch = self.samples_per_batch
        while True:
            # Read the position every step so load_state_dict() also steers a live iterator.
            if self.index >= self.batches_per_epoch:
                self.epoch, self.index = self.epoch + 1, 0
            idx = self._order_for(self.epoch)[self.index * batch : (self.index + 1) * batch]
            self.index += 1
            yield self._batch(idx)

    def _batch(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        # index_select on device tensors: no host sync, and a copy, so callers may modify batches.
        if self.kind == "tokens":
            windows = self.inputs.index_select(0, idx)
            # Contiguous because loss code often calls .view(-1) on targets.
            return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
        return self.inputs.index_select(0, idx), self.targets.index_select(0, idx)


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def _make_images(
    n: int,
    shape: tuple[int, int, int],
    num_classes: int,
    teacher_gen: torch.Generator,
    data_gen: torch.Generator,
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    c, h, w = shape
    lh, lw = min(_IMAGE_LATENT, h), min(_IMAGE_LATENT, w)
    teacher = torch.randn(c * lh * lw, num_classes, generator=teacher_gen, device=device) / (c * lh * lw) ** 0.5
    images = torch.empty(n, c, h, w, device=device)
    targets = torch.empty(n, dtype=torch.long, device=device)
    chunk = max(1, _CHUNK_BYTES // (4 * c * h * w))
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        latent = torch.randn(stop - start, c, lh, lw, generator=data_gen, device=device)
        up = F.interpolate(latent, size=(h, w), mode="bilinear", align_corners=False)
        # In place: the noise is drawn straight into the pool, no second image-sized temporary.
        images[start:stop].normal_(generator=data_gen).mul_(_IMAGE_NOISE).add_(up)
        targets[start:stop] = (latent.flatten(1) @ teacher).argmax(dim=1)
    return images, targets


def _make_token_windows(
    n: int,
    length: int,
    vocab: int,
    teacher_gen: torch.Generator,
    data_gen: torch.Generator,
    device: torch.device,
) -> Tensor:
    """`n` Markov chains of `length` tokens from a random sparse bigram table."""
    k = len(_BIGRAM_PROBS)
    successors = torch.randint(vocab, (vocab * k,), generator=teacher_gen, device=device)
    cumulative = torch.tensor(_BIGRAM_PROBS, device=device).cumsum(0)
    windows = torch.empty(n, length, dtype=torch.long, device=device)
    windows[:, 0] = torch.randint(vocab, (n,), generator=data_gen, device=device)
    # One small vectorised step per position: `length` kernel launches once at start-up.
    for t in range(1, length):
        u = torch.rand(n, generator=data_gen, device=device) * cumulative[-1]
        choice = torch.searchsorted(cumulative, u).clamp_(max=k - 1)
        windows[:, t] = successors[windows[:, t - 1] * k + choice]
    return windows
