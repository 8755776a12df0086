"""`build_data`: one DataConfig (+ the model's InputSpec) -> one DataSource for a rank and split."""

from __future__ import annotations

import torch

from kiln.config.schema import DATA_SOURCES, DataConfig
from kiln.config.validate import is_import_path
from kiln.data.base import DataSource, InputSpecLike, check_sample_shape, check_spec, resolve_seq_len
from kiln.data.files import TokenWindowDataset, build_file_pair, build_imagefolder
from kiln.data.loader import LoaderSource
from kiln.data.prepared import is_prepared, read_prepared
from kiln.data.synthetic import SyntheticSource
from kiln.data.user_data import KEY as USER_KEY
from kiln.data.user_data import load_user_dataset
from kiln.errors import ConfigError

SPLITS = ("train", "eval")


def build_data(
    cfg: DataConfig,
    spec: InputSpecLike | None,
    *,
    device: torch.device | str,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    split: str = "train",
) -> DataSource | None:
    """The batches one rank trains (or evaluates) on, already on `device`.

    Batches are `(inputs, targets)`: features float32 (B, D) with int64 class ids (B,); images
    float32 (B, C, H, W) with int64 (B,); tokens int64 (B, T) with targets (B, T), the same window
    shifted by one token, so the loss is plain cross-entropy.

    `split="eval"` gives a separate deterministic, unshuffled stream: synthetic data from another
    sample seed (same teacher, so the task is the same); file sources read `data.eval_path` (and
    `data.eval_labels_path` for `files`); a user function is called with `split="eval"`.
    Returns **None** when there is no eval data (a file source without `data.eval_path`, a user
    function without a `split` parameter or returning None): the trainer then skips eval with a
    warning. For `split="train"` the result is never None.

    Ranks see disjoint shards whose union per epoch is what world_size=1 sees (the
    DistributedSampler rule). Shape mismatches with `spec` raise ConfigError before training.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not (world_size >= 1 and 0 <= rank < world_size):
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    device = torch.device(device)
    if spec is not None:
        check_spec(spec)
    source = cfg.source
    if source == "synthetic":
        return SyntheticSource(cfg, spec, device=device, seed=seed, rank=rank, world_size=world_size, split=split)

    train = split == "train"
    tokens_per_batch = None
    if source in ("files", "tokens", "imagefolder"):
        path_key = "data.path" if train else "data.eval_path"
        path = cfg.path if train else cfg.eval_path
        if source == "tokens" and not train and not path and is_prepared(cfg.path):
            path_key, path = "data.path", cfg.path  # a prepared directory's own val.bin
        if not path:
            if train:
                raise ConfigError("data.path", f"data.source={source} needs a path")
            return None
        if source == "files":
            labels_key = "data.labels_path" if train else "data.eval_labels_path"
            labels = cfg.labels_path if train else cfg.eval_labels_path
            if not labels:
                raise ConfigError(labels_key, f"{path_key}={path} needs a targets file")
            seq_len = cfg.seq_len if spec is not None and spec.kind == "tokens" else 0
            dataset = build_file_pair((path, labels), (path_key, labels_key), spec, seq_len)
            if spec is not None and spec.kind == "tokens":
                tokens_per_batch = cfg.batch_size * dataset.sample_shape[0]
        elif source == "tokens":
            if spec is not None and spec.kind != "tokens":
                raise ConfigError("data.source", f"token data does not fit a model that takes {spec.kind}")
            seq_len = resolve_seq_len(cfg.seq_len, spec)
            check_sample_shape(path_key, (seq_len,), spec)
            vocab = spec.vocab_size if spec is not None else None
            path, token_dtype = _token_file(path, path_key, train, vocab, cfg.token_dtype)
            if not path:
                return None
            dataset = TokenWindowDataset(
                path, token_dtype=token_dtype, seq_len=seq_len, key=path_key, vocab_size=vocab
            )
            tokens_per_batch = cfg.batch_size * seq_len
        else:
            if spec is not None and spec.kind != "images":
                raise ConfigError("data.source", f"imagefolder does not fit a model that takes {spec.kind}")
            dataset = build_imagefolder(path, spec, path_key)
    elif is_import_path(source):
        dataset = load_user_dataset(source, split)
        if dataset is None:
            return None
        _check_first_sample(dataset, spec, cfg)
        if spec is not None and spec.kind == "tokens":
            tokens_per_batch = cfg.batch_size * resolve_seq_len(cfg.seq_len, spec)
    else:
        raise ConfigError("data.source", f"unknown source {source!r}", (*DATA_SOURCES, "module:function"))

    return LoaderSource(
        dataset,
        cfg,
        device=device,
        seed=seed,
        rank=rank,
        world_size=world_size,
        shuffle=cfg.shuffle and train,  # eval passes stay comparable
        tokens_per_batch=tokens_per_batch,
    )


def _token_file(path: str, key: str, train: bool, vocab_size: int | None, token_dtype: str) -> tuple[str, str]:
    """(token file, dtype) of a `tokens` split: the file named, or, for a directory written by
    `kiln data prepare`, its train.bin (train) or val.bin (eval) with the dtype its meta.json
    records (data.token_dtype is then not used). An empty file name: the directory has no val.bin."""
    if not is_prepared(path):
        return path, token_dtype
    prepared = read_prepared(path, key)
    meta_vocab = prepared.meta.get("vocab_size")
    if vocab_size and isinstance(meta_vocab, int) and meta_vocab > vocab_size:
        raise ConfigError("model.kwargs.vocab_size", f"the model's vocabulary has {vocab_size} tokens but {key}={path} "
                          f"was tokenized with {meta_vocab}: set model.kwargs.vocab_size={meta_vocab} (or more; llama: "
                          "and hf: models) for this data")
    split = prepared.train_path if train else prepared.val_path
    return (str(split) if split is not None else ""), prepared.dtype


def _check_first_sample(dataset: object, spec: InputSpecLike | None, cfg: DataConfig) -> None:
    """Check a map-style user dataset's first item (iterable ones are not consumed here)."""
    if spec is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return
    from torch.utils.data import IterableDataset

    if isinstance(dataset, IterableDataset):
        return
    try:
        item = dataset[0]  # type: ignore[index]
    except Exception as exc:
        raise ConfigError(USER_KEY, f"reading item 0 of the dataset failed: {type(exc).__name__}: {exc}") from exc
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise ConfigError(USER_KEY, f"dataset items must be (x, y) pairs, got {type(item).__name__}")
    shape = getattr(item[0], "shape", None)
    if shape is not None:
        check_sample_shape(USER_KEY, tuple(shape), spec, cfg.seq_len if spec.kind == "tokens" else 0)
