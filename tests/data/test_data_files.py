"""File sources: .npy/.pt pairs, .bin token windows, imagefolder, DataLoader sharding and resume."""

from __future__ import annotations

import itertools
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from kiln.config import ConfigError, DataConfig
from kiln.data import DataSource, build_data

CPU = torch.device("cpu")
N, D = 24, 4


def spec(kind: str, shape: tuple[int, ...], num_classes: int | None = None, vocab_size: int | None = None):
    return SimpleNamespace(kind=kind, shape=shape, num_classes=num_classes, vocab_size=vocab_size)


def take(source: DataSource, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(itertools.islice(iter(source), n))


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) and torch.equal(t, u) for (x, t), (y, u) in zip(a, b))


def ids(batches) -> list[int]:
    # Row i of the inputs starts with the value i (see `pair`), so inputs identify samples.
    return [int(v) for x, _ in batches for v in x[:, 0].tolist()]


@pytest.fixture
def pair(tmp_path):
    """Features (N, D) float64 where row i is i + [0, .1, .2, .3]; labels int32 i % 3."""
    x = np.arange(N, dtype=np.float64)[:, None] + np.arange(D) / 10
    y = (np.arange(N) % 3).astype(np.int32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    return str(tmp_path / "x.npy"), str(tmp_path / "y.npy")


def files_cfg(pair, **kw) -> DataConfig:
    return DataConfig(
        **{"source": "files", "path": pair[0], "labels_path": pair[1], "batch_size": 4, "num_workers": 0, **kw}
    )


def test_npy_pair_batches(pair):
    source = build_data(files_cfg(pair, shuffle=False), spec("features", (D,), 3), device=CPU, seed=0)
    assert source.batches_per_epoch == N // 4 and source.tokens_per_batch is None
    x, y = next(iter(source))
    assert x.dtype == torch.float32 and y.dtype == torch.int64 and x.device == CPU
    expected = torch.arange(4, dtype=torch.float32)[:, None] + torch.arange(D) / 10
    assert torch.allclose(x, expected) and y.tolist() == [0, 1, 2, 0]


def test_pt_pair_batches(tmp_path):
    torch.save(torch.randn(10, 3, 2, 2, dtype=torch.float64), tmp_path / "x.pt")
    torch.save(torch.arange(10, dtype=torch.int16), tmp_path / "y.pt")
    c = files_cfg((str(tmp_path / "x.pt"), str(tmp_path / "y.pt")), shuffle=False, batch_size=5)
    source = build_data(c, spec("images", (3, 2, 2), 10), device=CPU, seed=0)
    (x, y), (x2, y2) = take(source, 2)
    assert x.shape == (5, 3, 2, 2) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and y.tolist() == [0, 1, 2, 3, 4] and y2.tolist() == [5, 6, 7, 8, 9]


def test_file_errors_name_the_key(tmp_path, pair):
    with pytest.raises(ConfigError, match=r"data\.path.*nope\.npy"):
        build_data(files_cfg((str(tmp_path / "nope.npy"), pair[1])), None, device=CPU, seed=0)
    with pytest.raises(ConfigError, match=r"data\.labels_path.*nope\.npy"):
        build_data(files_cfg((pair[0], str(tmp_path / "nope.npy"))), None, device=CPU, seed=0)
    np.save(tmp_path / "short.npy", np.zeros(N - 1, dtype=np.int64))
    with pytest.raises(ConfigError, match=rf"data\.labels_path.*{N - 1}.*{N}"):
        build_data(files_cfg((pair[0], str(tmp_path / "short.npy"))), None, device=CPU, seed=0)
    with pytest.raises(ConfigError, match=rf"data\.path.*D={D}.*expects D=5"):
        build_data(files_cfg(pair), spec("features", (5,), 3), device=CPU, seed=0)
    (tmp_path / "x.csv").write_text("1,2\n")
    with pytest.raises(ConfigError, match=r"data\.path.*\.npy or \.pt"):
        build_data(files_cfg((str(tmp_path / "x.csv"), pair[1])), None, device=CPU, seed=0)
    with pytest.raises(ConfigError, match=r"data\.batch_size"):
        build_data(files_cfg(pair, batch_size=100), None, device=CPU, seed=0)
    c = files_cfg(pair, eval_path=str(tmp_path / "missing.npy"), eval_labels_path=pair[1])
    with pytest.raises(ConfigError, match=r"data\.eval_path.*missing\.npy"):
        build_data(c, None, device=CPU, seed=0, split="eval")


def test_eval_split_needs_eval_path(pair):
    assert build_data(files_cfg(pair), None, device=CPU, seed=0, split="eval") is None
    c = files_cfg(pair, eval_path=pair[0], eval_labels_path=pair[1])
    source = build_data(c, None, device=CPU, seed=0, split="eval")
    assert ids(take(source, 2)) == list(range(8))  # eval is never shuffled


def test_ranks_are_disjoint_and_cover_world_one(pair):
    c = files_cfg(pair)
    whole = build_data(c, None, device=CPU, seed=7)
    r0 = build_data(c, None, device=CPU, seed=7, rank=0, world_size=2)
    r1 = build_data(c, None, device=CPU, seed=7, rank=1, world_size=2)
    assert (whole.batches_per_epoch, r0.batches_per_epoch) == (6, 3)
    epochs = []
    for _epoch in range(2):
        w, a, b = ids(take(whole, 6)), ids(take(r0, 3)), ids(take(r1, 3))
        assert not set(a) & set(b) and set(a) | set(b) == set(w) == set(range(N))
        epochs.append(w)
    assert epochs[0] != epochs[1]  # reshuffled with seed + epoch


def test_resume_continues_identical_stream(pair):
    stream = take(build_data(files_cfg(pair), None, device=CPU, seed=1), 15)  # 6 per epoch
    first = build_data(files_cfg(pair), None, device=CPU, seed=1)
    take(first, 4)
    resumed = build_data(files_cfg(pair), None, device=CPU, seed=1)
    resumed.load_state_dict(first.state_dict())
    assert same(take(resumed, 11), stream[4:])
    resumed.reset()
    assert same(take(resumed, 3), stream[:3])


def test_two_workers_give_the_same_stream(pair):
    plain = take(build_data(files_cfg(pair), None, device=CPU, seed=2), 8)
    workers = build_data(files_cfg(pair, num_workers=2, prefetch_factor=2), None, device=CPU, seed=2)
    assert same(take(workers, 8), plain)


def write_tokens(path, dtype, n: int, seed: int = 0) -> np.ndarray:
    high = 60_000 if dtype == np.uint16 else 2**31
    tokens = np.random.default_rng(seed).integers(0, high, size=n).astype(dtype)
    tokens.tofile(path)
    return tokens


@pytest.mark.parametrize("dtype_name", ["uint16", "uint32"])
def test_token_windows_are_slices_of_the_file(tmp_path, dtype_name):
    dtype = np.uint16 if dtype_name == "uint16" else np.uint32
    tokens = write_tokens(tmp_path / "t.bin", dtype, 101).astype(np.int64)
    c = DataConfig(
        source="tokens", path=str(tmp_path / "t.bin"), token_dtype=dtype_name, seq_len=10, batch_size=3, num_workers=0
    )
    source = build_data(c, None, device=CPU, seed=0)
    assert source.batches_per_epoch == 10 // 3 and source.tokens_per_batch == 30
    starts = set()
    for x, y in take(source, 3):
        assert x.shape == y.shape == (3, 10) and x.dtype == y.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])
        for row, target in zip(x.tolist(), y.tolist()):
            start = next(s for s in range(0, 91, 10) if tokens[s : s + 10].tolist() == row)
            assert tokens[start + 1 : start + 11].tolist() == target
            starts.add(start)
    assert len(starts) == 9  # distinct non-overlapping windows within an epoch
    if dtype == np.uint32:
        assert int(x.max()) > 65535


def test_token_file_errors(tmp_path):
    write_tokens(tmp_path / "t.bin", np.uint16, 10)
    base = {"source": "tokens", "path": str(tmp_path / "t.bin"), "num_workers": 0, "batch_size": 1}
    with pytest.raises(ConfigError, match=r"data\.path.*10 tokens.*11"):
        build_data(DataConfig(**base, seq_len=10), None, device=CPU, seed=0)
    with pytest.raises(ConfigError, match=r"data\.path.*missing\.bin"):
        build_data(DataConfig(**{**base, "path": str(tmp_path / "missing.bin")}, seq_len=4), None, device=CPU, seed=0)
    (tmp_path / "odd.bin").write_bytes(b"\0" * 10)
    with pytest.raises(ConfigError, match=r"data\.token_dtype"):
        c = DataConfig(**{**base, "path": str(tmp_path / "odd.bin")}, seq_len=1, token_dtype="uint32")
        build_data(c, None, device=CPU, seed=0)
    with pytest.raises(ConfigError, match=r"data\.path.*vocab_size is 5"):
        build_data(DataConfig(**base, seq_len=4), spec("tokens", (4,), vocab_size=5), device=CPU, seed=0)
    with pytest.raises(ConfigError, match=r"data\.seq_len"):
        build_data(DataConfig(**base), None, device=CPU, seed=0)
    # seq_len defaults to the model's context
    source = build_data(DataConfig(**base), spec("tokens", (3,), vocab_size=70_000), device=CPU, seed=0)
    assert next(iter(source))[0].shape == (1, 3)


def test_imagefolder_without_torchvision(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import fails as if not installed
    c = DataConfig(source="imagefolder", path=str(tmp_path), num_workers=0)
    with pytest.raises(ConfigError, match=r"data\.source.*pip install torchvision"):
        build_data(c, spec("images", (3, 32, 32), 10), device=CPU, seed=0)
