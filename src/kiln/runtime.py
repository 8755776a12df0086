"""Process-level setup every command shares (train, bench, advise, tune, profile): device choice,
seeds, deterministic mode, the default run directory."""

from __future__ import annotations

import contextlib
import os
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from kiln.errors import ConfigError


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("training.device", f"{spec} asked for, but this torch sees no CUDA device", ("auto", "cpu"))
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            choices = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
            raise ConfigError("training.device", f"{spec} does not exist", choices)
        device = torch.device("cuda", index)
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds every CUDA device too


@contextlib.contextmanager
def deterministic_mode(enabled: bool) -> Iterator[None]:
    """Deterministic kernels for the duration of a run, restoring torch's previous settings.

    cuBLAS needs CUBLAS_WORKSPACE_CONFIG for deterministic matmuls (PyTorch "Reproducibility"
    notes); it only takes effect if set before the first cuBLAS call, so set it early.
    """
    if not enabled:
        yield
        return
    old = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old[0])
        torch.backends.cudnn.benchmark = old[1]
        torch.backends.cudnn.deterministic = old[2]
        if old[3] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


DEFAULT_RUNS_ROOT = "runs"
"""Where runs without --run-dir go: runs/<YYYYmmdd-HHMMSS>-<model>[-N]."""


def run_slug(model_name: str) -> str:
    """The model part of a default run dir's name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-")[:40] or "model"


def default_run_dir(model_name: str, root: str | Path = DEFAULT_RUNS_ROOT) -> Path:
    """A new timestamped run dir for a run without --run-dir."""
    slug = run_slug(model_name)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(root) / f"{stamp}-{slug}"
    n = 1
    while path.exists():
        n += 1
        path = Path(root) / f"{stamp}-{slug}-{n}"
    return path
