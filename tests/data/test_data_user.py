"""User data sources: `module:function` and `path/file.py:function`."""

from __future__ import annotations

import itertools
import textwrap
from types import SimpleNamespace

import pytest
import torch

from kiln.config import ConfigError, DataConfig
from kiln.data import build_data

CPU = torch.device("cpu")

USER_CODE = textwrap.dedent(
    """
    import torch
    from torch.utils.data import Dataset, IterableDataset, TensorDataset

    def pairs(split="train"):
        start = 0 if split == "train" else 1000
        x = torch.arange(start, start + 16, dtype=torch.float64)[:, None].repeat(1, 3)
        return TensorDataset(x, torch.arange(16, dtype=torch.int32) % 2)

    def train_only():
        return TensorDataset(torch.zeros(8, 3), torch.zeros(8, dtype=torch.long))

    class Stream(IterableDataset):
        def __init__(self):
            self.epoch = 0

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __iter__(self):
            for i in range(12):
                yield torch.full((3,), float(i + 100 * self.epoch)), torch.tensor(i % 2)

    def stream():
        return Stream()

    def broken():
        raise RuntimeError("disk on fire")

    def not_a_dataset():
        return 42

    value = 3
    """
)


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_data.py"
    path.write_text(USER_CODE)
    return str(path)


def cfg(source: str, **kw) -> DataConfig:
    return DataConfig(**{"source": source, "batch_size": 4, "num_workers": 0, "shuffle": False, **kw})


def features(dim: int = 3):
    return SimpleNamespace(kind="features", shape=(dim,), num_classes=2, vocab_size=None)


def firsts(source, n):
    return [int(v) for x, _ in itertools.islice(iter(source), n) for v in x[:, 0].tolist()]


def test_file_function_map_style(user_file):
    source = build_data(cfg(f"{user_file}:pairs"), features(), device=CPU, seed=0)
    x, y = next(iter(source))
    assert x.shape == (4, 3) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert x[:, 0].tolist() == [0, 1, 2, 3]
    eval_source = build_data(cfg(f"{user_file}:pairs"), features(), device=CPU, seed=0, split="eval")
    assert firsts(eval_source, 1) == [1000, 1001, 1002, 1003]
    assert build_data(cfg(f"{user_file}:train_only"), features(), device=CPU, seed=0, split="eval") is None


def test_module_function(tmp_path, monkeypatch):
    (tmp_path / "kiln_test_user_mod.py").write_text(USER_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    source = build_data(cfg("kiln_test_user_mod:pairs"), features(), device=CPU, seed=0)
    assert firsts(source, 1) == [0, 1, 2, 3]


def test_module_in_working_directory(tmp_path, monkeypatch):
    # Console scripts do not put the working directory on sys.path; kiln looks there itself.
    (tmp_path / "kiln_test_cwd_mod.py").write_text(USER_CODE)
    monkeypatch.chdir(tmp_path)
    source = build_data(cfg("kiln_test_cwd_mod:train_only"), None, device=CPU, seed=0)
    assert next(iter(source))[0].shape == (4, 3)


def test_iterable_dataset_sharded_by_rank_and_resumable(user_file):
    c = cfg(f"{user_file}:stream")
    whole = build_data(c, None, device=CPU, seed=0)
    assert whole.batches_per_epoch is None
    r0 = build_data(c, None, device=CPU, seed=0, rank=0, world_size=2)
    r1 = build_data(c, None, device=CPU, seed=0, rank=1, world_size=2)
    w, a, b = firsts(whole, 3), firsts(r0, 1), firsts(r1, 1)
    assert not set(a) & set(b) and set(a) | set(b) <= set(w)
    assert firsts(whole, 3) == [100 + i for i in range(12)]  # epoch 1 after set_epoch(1)
    resumed = build_data(c, None, device=CPU, seed=0)
    resumed.load_state_dict({"epoch": 1, "index": 1})
    assert firsts(resumed, 2) == [104 + i for i in range(8)]


def test_iterable_with_workers(user_file):
    # Two workers of one rank split the stream between them and the union is complete.
    source = build_data(cfg(f"{user_file}:stream", num_workers=2, batch_size=2), None, device=CPU, seed=0)
    assert sorted(firsts(source, 6)) == list(range(12))


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("{file}:missing", "has no function 'missing'"),
        ("{file}:value", "not a function"),
        ("{file}:broken", "raised RuntimeError: disk on fire"),
        ("{file}:not_a_dataset", "returned int"),
        ("{dir}/nope.py:pairs", "file not found"),
        ("kiln_no_such_module_xyz:pairs", "no module named"),
    ],
)
def test_bad_user_functions(user_file, target, message):
    source = target.format(file=user_file, dir=user_file.rsplit("/", 1)[0])
    with pytest.raises(ConfigError, match=rf"data\.source.*{message}"):
        build_data(cfg(source), None, device=CPU, seed=0)


def test_user_sample_shape_is_checked(user_file):
    with pytest.raises(ConfigError, match=r"data\.source.*D=3.*expects D=5"):
        build_data(cfg(f"{user_file}:pairs"), features(5), device=CPU, seed=0)
