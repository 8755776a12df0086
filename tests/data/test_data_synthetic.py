"""Synthetic data: shapes, determinism, learnability, sharding, resume."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from kiln.config import ConfigError, DataConfig
from kiln.data import DataSource, build_data
from kiln.data.synthetic import pool_size

CPU = torch.device("cpu")


def spec(kind: str, shape: tuple[int, ...], num_classes: int | None = None, vocab_size: int | None = None):
    # Structurally what kiln.models.InputSpec is; data code only reads the attributes.
    return SimpleNamespace(kind=kind, shape=shape, num_classes=num_classes, vocab_size=vocab_size)


FEATURES = spec("features", (8,), num_classes=4)
IMAGES = spec("images", (3, 8, 8), num_classes=5)
TOKENS = spec("tokens", (16,), vocab_size=50)


def take(source: DataSource, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(itertools.islice(iter(source), n))


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) and torch.equal(t, u) for (x, t), (y, u) in zip(a, b))


def cfg(**kw) -> DataConfig:
    return DataConfig(**{"batch_size": 8, "synthetic_samples": 64, **kw})


@pytest.mark.parametrize(
    ("s", "x_shape", "x_dtype", "y_shape"),
    [
        (FEATURES, (8, 8), torch.float32, (8,)),
        (IMAGES, (8, 3, 8, 8), torch.float32, (8,)),
        (TOKENS, (8, 16), torch.int64, (8, 16)),
    ],
)
def test_shapes_dtypes_device(s, x_shape, x_dtype, y_shape):
    source = build_data(cfg(), s, device=CPU, seed=0)
    assert source.samples_per_batch == 8
    assert source.tokens_per_batch == (8 * 16 if s.kind == "tokens" else None)
    for x, y in take(source, 3):
        assert tuple(x.shape) == x_shape and x.dtype == x_dtype and x.device == CPU
        assert tuple(y.shape) == y_shape and y.dtype == torch.int64 and y.device == CPU
    if s.num_classes:
        assert int(y.max()) < s.num_classes


def test_seq_len_override_and_missing_vocab():
    source = build_data(cfg(seq_len=4), TOKENS, device="cpu", seed=0)
    x, y = next(iter(source))
    assert x.shape == (8, 4) and source.tokens_per_batch == 32
    with pytest.raises(ConfigError, match="data.source"):
        build_data(cfg(), spec("tokens", (16,)), device=CPU, seed=0)


def test_deterministic_per_seed_and_split():
    a = take(build_data(cfg(), FEATURES, device=CPU, seed=1), 4)
    b = take(build_data(cfg(), FEATURES, device=CPU, seed=1), 4)
    other_seed = take(build_data(cfg(), FEATURES, device=CPU, seed=2), 4)
    eval_split = take(build_data(cfg(), FEATURES, device=CPU, seed=1, split="eval"), 4)
    assert same(a, b)
    assert not torch.equal(a[0][0], other_seed[0][0])
    assert not torch.equal(a[0][0], eval_split[0][0])


def test_learnable_and_eval_shares_the_teacher():
    torch.manual_seed(0)
    source = build_data(cfg(batch_size=64, synthetic_samples=1024), FEATURES, device=CPU, seed=0)
    eval_source = build_data(cfg(batch_size=256, synthetic_samples=1024), FEATURES, device=CPU, seed=0, split="eval")
    ex, ey = next(iter(eval_source))
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with torch.no_grad():
        eval_before = F.cross_entropy(model(ex), ey).item()
    losses = []
    for x, y in itertools.islice(iter(source), 100):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < 0.6 * sum(losses[:10]) / 10
    with torch.no_grad():
        # Held-out data from the same teacher: what was learnt transfers.
        assert F.cross_entropy(model(ex), ey).item() < 0.6 * eval_before


def test_images_are_learnable_from_coarse_structure():
    # The class is a function of the low-resolution latent; a linear probe on average-pooled
    # pixels must find it (sanity check that the teacher is not noise).
    source = build_data(cfg(batch_size=64, synthetic_samples=512), IMAGES, device=CPU, seed=0)
    probe = torch.nn.Linear(3 * 8 * 8, 5)
    opt = torch.optim.Adam(probe.parameters(), lr=1e-2)
    losses = []
    for x, y in itertools.islice(iter(source), 100):
        loss = F.cross_entropy(probe(x.flatten(1)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:10]) / 10


def test_tokens_targets_are_shifted_inputs_from_sparse_bigrams():
    source = build_data(cfg(synthetic_samples=256), TOKENS, device=CPU, seed=0)
    successors: dict[int, set[int]] = {}
    for x, y in take(source, 32):
        assert torch.equal(x[:, 1:], y[:, :-1])
        for a, b in zip(x.flatten().tolist(), y.flatten().tolist()):
            successors.setdefault(a, set()).add(b)
        assert int(x.max()) < 50 and int(x.min()) >= 0
    # Each token has at most 4 successors: next-token entropy is far below log(vocab).
    assert max(len(s) for s in successors.values()) <= 4
    assert math.log(50) > 3.0


def _rows(batches) -> list[tuple[float, ...]]:
    return [tuple(row.tolist()) for x, _ in batches for row in x]


def test_ranks_are_disjoint_and_cover_world_one():
    c = cfg(synthetic_samples=64, batch_size=8)
    whole = build_data(c, FEATURES, device=CPU, seed=3)
    r0 = build_data(c, FEATURES, device=CPU, seed=3, rank=0, world_size=2)
    r1 = build_data(c, FEATURES, device=CPU, seed=3, rank=1, world_size=2)
    assert whole.batches_per_epoch == 8 and r0.batches_per_epoch == r1.batches_per_epoch == 4
    for _epoch in range(2):
        w, a, b = _rows(take(whole, 8)), _rows(take(r0, 4)), _rows(take(r1, 4))
        assert not set(a) & set(b)
        assert set(a) | set(b) == set(w)
        assert len(set(w)) == 64


def test_epochs_reshuffle_unless_disabled():
    shuffled = take(build_data(cfg(), FEATURES, device=CPU, seed=0), 16)
    epoch0, epoch1 = _rows(shuffled[:8]), _rows(shuffled[8:])
    assert set(epoch0) == set(epoch1) and epoch0 != epoch1
    plain = take(build_data(cfg(shuffle=False), FEATURES, device=CPU, seed=0), 16)
    assert _rows(plain[:8]) == _rows(plain[8:])


def test_resume_continues_identical_stream():
    reference = build_data(cfg(), TOKENS, device=CPU, seed=5)
    stream = take(reference, 20)  # 8 batches per epoch: crosses two epoch boundaries
    first = build_data(cfg(), TOKENS, device=CPU, seed=5)
    take(first, 6)
    state = first.state_dict()
    assert state == {"epoch": 0, "index": 6}
    resumed = build_data(cfg(), TOKENS, device=CPU, seed=5)
    resumed.load_state_dict(state)
    assert same(take(resumed, 14), stream[6:])
    # A live iterator follows load_state_dict too, and reset() rewinds.
    it = iter(resumed)
    next(it)
    resumed.load_state_dict({"epoch": 1, "index": 2})
    assert same([next(it)], stream[10:11])
    resumed.reset()
    assert same(take(resumed, 2), stream[:2])


def test_eval_split_is_unshuffled_and_repeatable():
    source = build_data(cfg(), FEATURES, device=CPU, seed=0, split="eval")
    a = take(source, 3)
    source.reset()
    assert same(a, take(source, 3))
    epoch = take(source, 8)  # index 3..7 of epoch 0 then epoch 1: same order every epoch
    assert same(epoch[5:8], a)


def test_needs_a_spec():
    with pytest.raises(ConfigError, match="data.source.*input shape.*example_inputs"):
        build_data(cfg(), None, device=CPU, seed=0)
    with pytest.raises(ConfigError, match="num_classes"):
        build_data(cfg(), spec("features", (8,)), device=CPU, seed=0)


def test_pool_is_capped_but_holds_one_batch_per_rank():
    image_bytes = 3 * 224 * 224 * 4
    assert pool_size(4096, image_bytes, 32, 1, 512 * 2**20) == 512 * 2**20 // image_bytes
    assert pool_size(10, image_bytes, 32, 2, 2**20) == 64
    assert pool_size(100, 32, 8, 1, 2**30) == 100
    source = build_data(cfg(synthetic_samples=4, batch_size=8), FEATURES, device=CPU, seed=0, world_size=2)
    assert source.batches_per_epoch == 1 and next(iter(source))[0].shape == (8, 8)
