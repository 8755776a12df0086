"""Small model / optimizer / data setup shared by the checkpoint tests (CPU, deterministic)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kiln.checkpoint import AppState, Checkpointer
from kiln.config.schema import CheckpointConfig, DataConfig
from kiln.data import build_data
from kiln.models.spec import InputSpec

SPEC = InputSpec(kind="features", shape=(6,), num_classes=3)


def make_model(out: int = 3, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, out)
    )


@dataclass
class Run:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    data: object
    app: AppState

    def __post_init__(self) -> None:
        self.it = iter(self.data)

    def step(self) -> torch.Tensor:
        """One step that draws on every RNG the state captures (dropout: torch; noise: numpy, python)."""
        inputs, targets = next(self.it)
        noise = torch.from_numpy(np.random.standard_normal(inputs.shape).astype(np.float32)) * 0.01
        inputs = inputs + noise * random.random()
        loss = torch.nn.functional.cross_entropy(self.model(inputs), targets)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.app.progress["step"] += 1
        self.app.progress["samples_seen"] += targets.numel()
        return loss.detach()


def make_run(seed: int = 0, *, fused: bool = False, rank: int = 0, world_size: int = 1) -> Run:
    """`seed` initialises the model only; the data is the same run config (seed 0) every time."""
    model = make_model(seed=seed)
    extra = {"fused": True} if fused else {"foreach": True}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, **extra)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + 0.1 * s))
    cfg = DataConfig(batch_size=8, synthetic_samples=64)
    data = build_data(cfg, SPEC, device="cpu", seed=0, rank=rank, world_size=world_size)
    app = AppState(model, optimizer, scheduler, data=data, rank=rank, world_size=world_size,
                   device=torch.device("cpu"))
    return Run(model, optimizer, scheduler, data, app)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def checkpointer(run_dir: Path, **cfg) -> Checkpointer:
    return Checkpointer(run_dir, CheckpointConfig(**cfg), rank=0, world_size=1)


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, state in optimizer.state_dict()["state"].items():
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                out[f"optim.{i}.{k}"] = v.clone()
    return out


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"differ: {different}"


def tree_digest(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its content: compares a directory before and after."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
