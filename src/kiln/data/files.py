"""Map-style datasets over files: tensor pairs (.npy/.pt), flat token files (.bin), image folders.

The datasets open their files lazily and drop the handles when pickled, so DataLoader workers
(fork, spawn or forkserver) each map the file themselves instead of receiving a copy of it.
Every problem a user can fix (missing file, wrong lengths, wrong shape, wrong dtype) is a
ConfigError raised at construction, naming the config key, so it surfaces before training starts.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from kiln.data.base import InputSpecLike, check_sample_shape
from kiln.errors import ConfigError

TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
# Token ids are checked against vocab_size on this many leading tokens: enough to catch a wrong
# token_dtype or tokenizer, cheap even for multi-GB files.
_VOCAB_CHECK_TOKENS = 1 << 20
# ImageNet statistics, the normalisation pretrained vision models expect.
_IMAGE_MEAN = (0.485, 0.456, 0.406)
_IMAGE_STD = (0.229, 0.224, 0.225)


def _require_file(key: str, path: str) -> None:
    if not path:
        raise ConfigError(key, "no file given")
    if not os.path.isfile(path):
        raise ConfigError(key, f"file not found: {path}")


def load_array(key: str, path: str) -> np.ndarray | Tensor:
    """Open a `.npy` (memory-mapped, no pickles) or `.pt` (weights_only) array."""
    _require_file(key, path)
    ext = os.path.splitext(path)[1].lower()
    try:
        if ext == ".npy":
            return np.load(path, mmap_mode="r", allow_pickle=False)
        if ext == ".pt":
            try:
                # mmap keeps large tensors on disk; older (non-zip) files cannot be mapped.
                obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:
                obj = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(obj, Tensor):
                raise ConfigError(key, f"{path} holds a {type(obj).__name__}, expected one tensor")
            return obj
    except ConfigError:
        raise
    except Exception as exc:  # corrupt file, pickled objects, ...: the user fixes the file
        raise ConfigError(key, f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    raise ConfigError(key, f"{path}: expected a .npy or .pt file")


class TensorPairDataset(Dataset):
    """Row i of the inputs file with row i of the targets file.

    Inputs become float32 when floating (or when the model takes features/images), else int64
    (token ids); integer targets become int64 (class ids), floating ones float32.
    """

    def __init__(
        self,
        inputs_path: str,
        targets_path: str,
        *,
        inputs_key: str,
        targets_key: str,
        float_inputs: bool | None = None,
    ):
        self.inputs_path, self.targets_path = inputs_path, targets_path
        self.inputs_key, self.targets_key = inputs_key, targets_key
        inputs, targets = load_array(inputs_key, inputs_path), load_array(targets_key, targets_path)
        if inputs.ndim == 0 or targets.ndim == 0:
            raise ConfigError(
                inputs_key if inputs.ndim == 0 else targets_key, "expected an array with one row per sample"
            )
        if len(inputs) != len(targets):
            raise ConfigError(
                targets_key,
                f"targets have {len(targets)} rows but inputs ({inputs_path}) have {len(inputs)}; they must match",
            )
        if len(inputs) == 0:
            raise ConfigError(inputs_key, f"{inputs_path} has no samples")
        self.length = len(inputs)
        self.sample_shape = tuple(int(s) for s in inputs.shape[1:])
        self.target_shape = tuple(int(s) for s in targets.shape[1:])
        self.float_inputs = _is_floating(inputs) if float_inputs is None else float_inputs
        self.float_targets = _is_floating(targets)
        self._inputs: np.ndarray | Tensor | None = inputs
        self._targets: np.ndarray | Tensor | None = targets

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        if self._inputs is None or self._targets is None:  # first access in a worker
            self._inputs = load_array(self.inputs_key, self.inputs_path)
            self._targets = load_array(self.targets_key, self.targets_path)
        return _row(self._inputs, i, self.float_inputs), _row(self._targets, i, self.float_targets)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_inputs": None, "_targets": None}


def _is_floating(array: np.ndarray | Tensor) -> bool:
    if isinstance(array, Tensor):
        return array.is_floating_point()
    return bool(np.issubdtype(array.dtype, np.floating))


def _row(array: np.ndarray | Tensor, i: int, as_float: bool) -> Tensor:
    if isinstance(array, Tensor):
        return array[i].to(torch.float32 if as_float else torch.int64)
    # np.asarray copies out of the read-only memmap (torch warns on non-writable arrays).
    return torch.from_numpy(np.asarray(array[i], dtype=np.float32 if as_float else np.int64))


class TokenWindowDataset(Dataset):
    """Non-overlapping windows of `seq_len + 1` tokens of a flat `.bin` file; item i is
    `(tokens[i*T : i*T+T], tokens[i*T+1 : i*T+T+1])`. Windows share their boundary token, so
    (n_tokens - 1) // T windows use every token as a target once; the sampler shuffles them."""

    def __init__(self, path: str, *, token_dtype: str, seq_len: int, key: str, vocab_size: int | None = None):
        _require_file(key, path)
        if token_dtype not in TOKEN_DTYPES:
            raise ConfigError("data.token_dtype", f"unknown token dtype {token_dtype!r}", TOKEN_DTYPES)
        self.path, self.token_dtype, self.seq_len = path, token_dtype, seq_len
        itemsize = np.dtype(TOKEN_DTYPES[token_dtype]).itemsize
        size = os.path.getsize(path)
        if size % itemsize:
            raise ConfigError("data.token_dtype", f"{path} is {size} bytes, not a whole number of {token_dtype} tokens")
        self.num_tokens = size // itemsize
        if self.num_tokens < seq_len + 1:
            raise ConfigError(
                key, f"{path} has {self.num_tokens} tokens, fewer than one window of data.seq_len+1={seq_len + 1}"
            )
        self.length = (self.num_tokens - 1) // seq_len
        self.sample_shape = (seq_len,)
        self._tokens: np.memmap | None = None
        if vocab_size:
            head = int(self._memmap()[:_VOCAB_CHECK_TOKENS].max())
            if head >= vocab_size:
                raise ConfigError(
                    key,
                    f"{path} holds token id {head} but the model's vocab_size is {vocab_size} (check data.token_dtype)",
                )

    def _memmap(self) -> np.memmap:
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=TOKEN_DTYPES[self.token_dtype], mode="r")
        return self._tokens

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        if not 0 <= i < self.length:
            raise IndexError(i)
        start = i * self.seq_len
        window = torch.from_numpy(np.asarray(self._memmap()[start : start + self.seq_len + 1], dtype=np.int64))
        return window[:-1], window[1:]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None}


def build_file_pair(
    paths: tuple[str, str], keys: tuple[str, str], spec: InputSpecLike | None, seq_len: int
) -> TensorPairDataset:
    """`data.source=files`: an inputs file and a targets file, checked against the model."""
    float_inputs = True if spec is not None and spec.kind in ("features", "images") else None
    dataset = TensorPairDataset(paths[0], paths[1], inputs_key=keys[0], targets_key=keys[1], float_inputs=float_inputs)
    check_sample_shape(keys[0], dataset.sample_shape, spec, seq_len)
    if spec is not None and spec.kind in ("features", "images") and spec.num_classes and dataset.target_shape:
        raise ConfigError(
            keys[1], f"targets have per-sample shape {dataset.target_shape}, expected one class id per sample"
        )
    if spec is not None and spec.kind == "tokens" and dataset.target_shape != dataset.sample_shape:
        raise ConfigError(
            keys[1], f"token targets have per-sample shape {dataset.target_shape}, inputs {dataset.sample_shape}"
        )
    return dataset


def build_imagefolder(root: str, spec: InputSpecLike | None, key: str) -> Dataset:
    """`data.source=imagefolder`: torchvision's ImageFolder, resized and centre-cropped to the model's
    (C, H, W) (224x224 RGB when the model does not say), normalised with ImageNet statistics."""
    try:
        from torchvision import datasets, transforms
    except ImportError as exc:
        raise ConfigError("data.source", "imagefolder needs torchvision: pip install torchvision") from exc
    if not root:
        raise ConfigError(key, "no image directory given")
    if not os.path.isdir(root):
        raise ConfigError(key, f"directory not found: {root}")
    shape = tuple(spec.shape) if spec is not None and spec.kind == "images" else (3, 224, 224)
    if len(shape) != 3 or shape[0] not in (1, 3):
        raise ConfigError("model.name", f"imagefolder makes 1- or 3-channel images, the model expects {shape}")
    channels, height, width = shape
    steps: list[Any] = [
        # Resize the short side to 256/224 of the crop, the usual eval-style preprocessing.
        transforms.Resize(int(round(min(height, width) * 256 / 224))),
        transforms.CenterCrop((height, width)),
    ]
    if channels == 1:
        steps.append(transforms.Grayscale(num_output_channels=1))
    mean, std = (_IMAGE_MEAN, _IMAGE_STD) if channels == 3 else ((0.5,), (0.5,))
    steps += [transforms.ToTensor(), transforms.Normalize(mean, std)]
    try:
        return datasets.ImageFolder(root, transform=transforms.Compose(steps))
    except (FileNotFoundError, RuntimeError) as exc:  # e.g. no class folders / no images
        raise ConfigError(key, f"{root}: {exc}") from exc
