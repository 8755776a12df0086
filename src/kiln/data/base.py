"""The DataSource contract shared by every source, plus the small checks they all need.

A DataSource is an endless stream of `(inputs, targets)` batches already on the training device.
Its position is two integers, `(epoch, index)`: `index` counts the batches of `epoch` that have
been handed out. Every source derives its order from `(seed, epoch)` alone, so restoring those
two numbers reproduces the exact stream that would have followed (checkpoint resume).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any, Protocol

from torch import Tensor

from kiln.errors import ConfigError


class InputSpecLike(Protocol):
    """What data needs to know about the model; `kiln.models.InputSpec` has these attributes.

    Only used for type hints: data code reads the attributes and never imports kiln.models, so
    the two packages can be built (and tested) independently.
    """

    kind: str  # "features" | "images" | "tokens"
    shape: tuple[int, ...]  # per-sample input shape: (D,) | (C, H, W) | (T,)
    num_classes: int | None
    vocab_size: int | None
    # Optional: the model's position limit for tokens (read with getattr; None = `shape` is the limit).


SPEC_KINDS = ("features", "images", "tokens")


class DataSource:
    """An endless, resumable stream of `(inputs, targets)` micro-batches on the device.

    - `samples_per_batch`: samples in one micro-batch on this rank (`data.batch_size`);
    - `tokens_per_batch`: `B * T` for token data (the figure tokens/s is computed from), else None;
    - `batches_per_epoch`: batches this rank sees per epoch, when known (None for iterable data).

    Iterating continues from the current position (`state_dict()`); keep one live iterator at a
    time. `load_state_dict` before iterating resumes exactly; `reset()` rewinds to the start
    (useful to give every eval pass the same batches).
    """

    samples_per_batch: int
    tokens_per_batch: int | None
    batches_per_epoch: int | None

    def __init__(self, *, samples_per_batch: int, tokens_per_batch: int | None, batches_per_epoch: int | None):
        self.samples_per_batch = samples_per_batch
        self.tokens_per_batch = tokens_per_batch
        self.batches_per_epoch = batches_per_epoch
        self.epoch = 0
        self.index = 0
        # Bumped by load_state_dict so a live iterator notices that it must jump.
        self._version = 0

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        epoch, index = state.get("epoch"), state.get("index")
        if not (isinstance(epoch, int) and isinstance(index, int) and epoch >= 0 and index >= 0):
            raise ValueError(f"data state must have non-negative int 'epoch' and 'index', got {state!r}")
        self.epoch, self.index = epoch, index
        self._version += 1

    def reset(self) -> None:
        """Back to the first batch of epoch 0."""
        self.load_state_dict({"epoch": 0, "index": 0})

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(samples_per_batch={self.samples_per_batch}, "
            f"tokens_per_batch={self.tokens_per_batch}, batches_per_epoch={self.batches_per_epoch}, "
            f"epoch={self.epoch}, index={self.index})"
        )


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from a tuple, so streams like (seed, "eval") and (seed + 1, "train") never collide
    the way `seed + offset` schemes do."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def batches_per_epoch(samples: int, batch_size: int, drop_last: bool) -> int:
    return samples // batch_size if drop_last else -(-samples // batch_size)


def check_spec(spec: InputSpecLike) -> None:
    if spec.kind not in SPEC_KINDS:
        raise ConfigError("model.name", f"the model declares input kind {spec.kind!r}", SPEC_KINDS)


def max_tokens(spec: InputSpecLike) -> int | None:
    """The longest token sequence the model takes: its position limit when it declares one, else
    its declared sequence length (None when neither is known)."""
    limit = getattr(spec, "max_seq_len", None)
    if limit:
        return int(limit)
    return int(spec.shape[0]) if len(spec.shape) == 1 and spec.shape[0] > 0 else None


def resolve_seq_len(seq_len: int, spec: InputSpecLike | None) -> int:
    """`data.seq_len` when set (at most the model's position limit), else the model's declared
    sequence length."""
    if seq_len > 0:
        limit = max_tokens(spec) if spec is not None and spec.kind == "tokens" else None
        if limit is not None and seq_len > limit:
            raise ConfigError("data.seq_len", f"{seq_len} is longer than the model takes: its position limit "
                              f"(max_position_embeddings) is {limit}")
        return seq_len
    if spec is not None and spec.kind == "tokens" and len(spec.shape) == 1 and spec.shape[0] > 0:
        return int(spec.shape[0])
    raise ConfigError("data.seq_len", "set data.seq_len (the model does not declare a sequence length)")


def check_sample_shape(key: str, sample_shape: tuple[int, ...], spec: InputSpecLike | None, seq_len: int = 0) -> None:
    """Fail before training when per-sample inputs cannot fit the model.

    Token inputs only have to match `seq_len` when it was given explicitly (models take shorter
    sequences); features and images must match the declared shape exactly.
    """
    if spec is None:
        return
    sample_shape = tuple(int(s) for s in sample_shape)
    expected = tuple(int(s) for s in spec.shape)
    if spec.kind == "features":
        if len(sample_shape) != 1 or sample_shape != expected:
            got = f"D={sample_shape[0]}" if len(sample_shape) == 1 else f"per-sample shape {sample_shape}"
            raise ConfigError(key, f"inputs have {got}, model expects D={expected[0] if expected else '?'}")
    elif spec.kind == "images":
        if sample_shape != expected:
            raise ConfigError(key, f"inputs have per-sample shape (C, H, W)={sample_shape}, model expects {expected}")
    elif spec.kind == "tokens":
        if len(sample_shape) != 1:
            raise ConfigError(key, f"token inputs must be 1-D per sample (T,), got {sample_shape}")
        if seq_len and sample_shape[0] != seq_len:
            raise ConfigError(key, f"inputs have T={sample_shape[0]}, data.seq_len is {seq_len}")
        limit = max_tokens(spec)
        if limit is not None and sample_shape[0] > limit:
            raise ConfigError(key, f"inputs have T={sample_shape[0]}, model takes at most T={limit} "
                              "(its position limit, max_position_embeddings)")
