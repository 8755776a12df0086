"""Everything a run needs to continue exactly where it stopped, as one DCP `Stateful`.

Layout of `AppState.state_dict()` (DCP flattens it to dotted keys under `app.`):

    model       get_state_dict(model, optimizer)[0]: plain, DDP (no `module.` prefix) or FSDP2
                sharded DTensors alike; DCP reshards those on load with another world size
    optim       get_state_dict(...)[1]: optimizer state keyed by parameter FQN
    scheduler   LR scheduler state_dict()
    scaler      GradScaler state_dict() (fp16-mixed only)
    progress    step, samples_seen, tokens_seen, consecutive_skips (NonFiniteGuard), ... (global:
                identical on every rank)
    meta        world_size the checkpoint was written with
    rank_local  rank{r}: {rng: python, numpy, torch CPU, CUDA of this rank's device; data: position}

Rank-local values sit under a per-rank key because DCP keeps one copy of entries that every rank
writes under the same key (it assumes they are replicas, torch.distributed.checkpoint
_dedup_save_plans): RNG streams and data positions differ per rank and would be lost.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

log = logging.getLogger("kiln.checkpoint")

PROGRESS_KEYS = ("step", "samples_seen", "tokens_seen", "consecutive_skips")


def capture_rng(device: torch.device | None) -> dict[str, Any]:
    """RNG states as tensors and plain numbers (no numpy arrays: `weights_only` loads reject them)."""
    version, py_state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": gauss},
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    # Only this rank's own GPU: asking for CUDA state on a CPU run would create a CUDA context.
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device | None) -> None:
    if "python" in state:
        py = state["python"]
        random.setstate((int(py["version"]), tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    if "numpy" in state:
        npy = state["numpy"]
        keys = npy["keys"].numpy().astype(np.uint32)
        np.random.set_state((npy["kind"], keys, int(npy["pos"]), int(npy["has_gauss"]), float(npy["cached_gaussian"])))
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


class AppState:
    """Model, optimizer, scheduler, scaler, progress, RNG and data position of one rank.

    A DCP `Stateful` by its two methods (DCP's `Stateful` is a runtime-checkable protocol), not by
    subclassing it: torch.distributed.checkpoint (DTensor and sympy with it) is a large import, so
    it is imported when a state is made, not when a launcher or a config check imports this module.

    `progress` is a plain dict the trainer updates at every step (cheap: Python ints); it is read
    when a checkpoint is taken and overwritten in place by a load. `data` is anything with
    `state_dict()` / `load_state_dict()` (a kiln DataSource); `guard` a NonFiniteGuard.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        scaler: torch.amp.GradScaler | None = None,
        *,
        data: Any = None,
        guard: Any = None,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | None = None,
        progress: dict[str, int] | None = None,
    ) -> None:
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.data, self.guard = data, guard
        self.rank, self.world_size = rank, world_size
        self.device = device
        self.progress: dict[str, int] = {k: 0 for k in PROGRESS_KEYS}
        self.progress.update(progress or {})
        self.notes: list[str] = []
        """What the last load did beyond a plain restore (resharding, missing rank-local state)."""
        self.config_hyperparameters = False
        """Set by the Checkpointer when the checkpoint was saved with another config: the
        optimizer's hyper-parameters (lr, weight decay, betas, ...) and the schedule's base LRs
        are then this config's, not the checkpoint's (a branch with another learning rate)."""
        self._fresh: tuple[list[dict[str, Any]], list[float] | None] | None = None
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        # Sharded (not gathered) state under FSDP2: each rank writes its own shards.
        self.options = StateDictOptions(full_state_dict=False, cpu_offload=False)

    @property
    def rank_key(self) -> str:
        return f"rank{self.rank}"

    # -- Stateful ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self.options)
        local: dict[str, Any] = {"rng": capture_rng(self.device)}
        if self.data is not None:
            local["data"] = dict(self.data.state_dict())
        progress = dict(self.progress)  # a copy: an async save must not see later steps
        if self.guard is not None:
            progress.update(self.guard.state_dict())
        state: dict[str, Any] = {
            "model": model_sd,
            "optim": optim_sd,
            "progress": progress,
            "meta": {"world_size": self.world_size},
            "rank_local": {self.rank_key: local},
        }
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        self.notes = []
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=self.options,
        )
        if self.scheduler is not None and state.get("scheduler"):
            self.scheduler.load_state_dict(state["scheduler"])
        if self.config_hyperparameters and self._fresh is not None:
            self._apply_config_hyperparameters(*self._fresh)
        if self.scaler is not None:
            if state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
            else:
                self.notes.append("checkpoint has no grad scaler state: the scaler starts fresh")
        self.progress.update({k: int(v) for k, v in state.get("progress", {}).items()})
        if self.guard is not None:
            self.guard.load_state_dict(self.progress)

        saved_world = int(state.get("meta", {}).get("world_size", self.world_size))
        locals_ = state.get("rank_local", {})
        own = locals_.get(self.rank_key)
        if saved_world == self.world_size and own:
            restore_rng(own.get("rng", {}), self.device)
            if self.data is not None and "data" in own:
                self.data.load_state_dict(own["data"])
            return
        # Another world size: model and optimizer were resharded by DCP; RNG streams belong to
        # ranks, so a rank that existed keeps its own and a new one keeps its fresh seed.
        self.notes.append(f"resharded from world size {saved_world} to {self.world_size}")
        if own and "rng" in own:
            restore_rng(own["rng"], self.device)
        else:
            self.notes.append(f"rank {self.rank} is new: its RNG state is freshly seeded")
        first = locals_.get("rank0", {}).get("data")
        if self.data is not None and first is not None:
            # Position in samples of the epoch is what carries over: rank 0 had handed out
            # index * saved_world batches' worth globally, so this world resumes at the same sample.
            index = int(first["index"]) * saved_world // self.world_size
            self.data.load_state_dict({**first, "index": index})
            self.notes.append(f"data position epoch {first['epoch']} batch {first['index']} -> batch {index}")

    def _apply_config_hyperparameters(self, groups: list[dict[str, Any]], base_lrs: list[float] | None) -> None:
        for group, fresh in zip(self.optimizer.param_groups, groups):
            for key, value in fresh.items():
                if isinstance(group.get(key), torch.Tensor):
                    group[key].copy_(value if isinstance(value, torch.Tensor) else torch.tensor(value))
                else:
                    group[key] = value
        lambdas = getattr(self.scheduler, "lr_lambdas", None)
        if base_lrs is not None and lambdas is not None:  # LambdaLR: lr = base * factor(step)
            self.scheduler.base_lrs = list(base_lrs)
            lrs = [base * float(f(self.scheduler.last_epoch)) for base, f in zip(base_lrs, lambdas)]
            for group, lr in zip(self.optimizer.param_groups, lrs):
                if isinstance(group["lr"], torch.Tensor):
                    group["lr"].fill_(lr)
                else:
                    group["lr"] = lr
            self.scheduler._last_lr = lrs
        self.notes.append("saved with another config: the optimizer's hyper-parameters and the learning-rate "
                          "schedule are this config's")

    # -- for the Checkpointer -----------------------------------------------------------------
    def model_shapes(self) -> dict[str, tuple[int, ...]]:
        """Global shapes of the model's state (DTensor.shape is the unsharded shape)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        sd = get_model_state_dict(self.model, options=self.options)
        return {k: tuple(v.shape) for k, v in sd.items() if isinstance(v, torch.Tensor)}

    def load_template(self, saved_world_size: int) -> dict[str, Any]:
        """What to ask DCP for: the current state (its tensors are filled in place) plus rank 0's data
        position when the world size changed. Grads are dropped first: DCP's state_dict helper only
        materialises empty optimizer state when no parameter holds a gradient."""
        self.optimizer.zero_grad(set_to_none=True)
        keep = ("lr", "initial_lr", "weight_decay", "betas", "eps", "momentum", "dampening", "alpha")
        self._fresh = ([{k: (g[k].clone() if isinstance(g[k], torch.Tensor) else g[k]) for k in keep if k in g}
                        for g in self.optimizer.param_groups],
                       list(self.scheduler.base_lrs) if hasattr(self.scheduler, "base_lrs") else None)
        template = self.state_dict()
        if saved_world_size != self.world_size and self.data is not None:
            template["rank_local"].setdefault("rank0", {})["data"] = dict(self.data.state_dict())
        return template
