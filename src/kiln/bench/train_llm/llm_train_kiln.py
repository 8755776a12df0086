"""kiln's recipes as rows of `kiln bench train-llm`: the step a recipe trains, built by kiln train's
own build and apply path (`kiln_step`, also what `kiln autotune`'s LLM search times), and the row
kind that runs them (`KILN_ROWS`, shaped as a peer: kiln.bench.peers.interface)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import Tensor

from kiln.bench.peers.interface import Bench, NothingPrepared, PeerDefaults
from kiln.bench.train_llm.llm_train_ranks import launched_kiln_row
from kiln.bench.train_llm.llm_train_result import RowRun, TrainRow
from kiln.bench.train_llm.llm_train_rows import in_process_row
from kiln.compile_cache import compile_cache_dir
from kiln.config import load_config
from kiln.config.schema import Config
from kiln.models import build_model
from kiln.precision import apply_precision, resolve_precision, tf32_enabled
from kiln.runtime import deterministic_mode, resolve_device, seed_everything
from kiln.train.assemble import build_train_step
from kiln.train.attention import attention_backend
from kiln.train.compile_defaults import apply_measured_defaults
from kiln.train.features import resolve_features
from kiln.train.gpu_plan import planned_checkpointing
from kiln.train.strategy import resolve_strategy


def _process_group(device: torch.device, stack: contextlib.ExitStack) -> None:
    """A one-rank process group for a recipe that names a DDP/FSDP2 wrapper (as `kiln train` run by
    torchrun with one process has), on a free local port, destroyed when the row ends (later rows
    run without one, as a plain `kiln train` does)."""
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)
    stack.callback(dist.destroy_process_group)


@dataclass(frozen=True)
class _Shape:
    """What the feature checks read from a data source: the bench feeds its own batches."""

    samples_per_batch: int
    tokens_per_batch: int


def kiln_step(overrides: list[str] | Config, stack: contextlib.ExitStack):
    """kiln's training step for a config (or overrides on the default config), built the way
    `kiln train` builds it (precision, measured compile defaults, model, strategy, features,
    `build_train_step`), with the contexts the trainer runs its loop under entered on `stack`;
    returns the step, the resolved config (as a dict, with the strategy and features chosen) and
    the parameter count."""
    import copy
    import dataclasses

    cfg = copy.deepcopy(overrides) if isinstance(overrides, Config) else load_config(None, overrides)
    device = resolve_device(cfg.training.device)
    policy = resolve_precision(cfg.precision.policy, device)
    wrapped = cfg.distributed.strategy in ("ddp", "fsdp")
    if wrapped:
        _process_group(device, stack)
    note = apply_measured_defaults(cfg, device.type, 1, launched=wrapped)
    seed_everything(cfg.training.seed)
    built = build_model(cfg.model, device=device)
    model = apply_precision(built.module.to(device), policy)
    num_params = sum(p.numel() for p in model.parameters())
    param_bytes = torch.finfo(policy.param_dtype).bits // 8
    strategy, reason = resolve_strategy(cfg, 1, num_params, param_bytes, device, launched=wrapped)
    shape = _Shape(cfg.data.batch_size, cfg.data.batch_size * cfg.data.seq_len)
    features = resolve_features(cfg, built, model, policy, device, shape,  # no device plan here: `auto` is none
                                checkpointing=planned_checkpointing(None, cfg.training.activation_checkpointing))
    stack.enter_context(tf32_enabled(cfg.precision.tf32))
    stack.enter_context(deterministic_mode(cfg.training.deterministic))
    stack.enter_context(compile_cache_dir(cfg.compile.cache_dir if cfg.compile.enabled else "torch"))
    stack.enter_context(attention_backend(cfg.model.attention))
    step_fn = build_train_step(model, built.task, built.blocks, cfg, policy, device, strategy=strategy,
                               ce_kernel=features.ce_kernel, swiglu_kernel=features.swiglu_kernel,
                               activation_checkpointing=features.activation_checkpointing)

    def step(x: Tensor, y: Tensor) -> Tensor:
        return step_fn([(x, y)])[0]

    resolved = {"config": dataclasses.asdict(cfg), "strategy": strategy, "strategy_reason": reason,
                "compile_note": note, "features": features.as_dict(), "capture": getattr(step_fn, "capture_status", None)}
    return step, resolved, num_params


class KilnRecipeRows(PeerDefaults):
    """kiln's recipes as a row kind of `kiln bench train-llm`, shaped as a peer (kiln.bench.peers.interface):
    the bench's base config plus the recipe's overrides, built by kiln train's own path (at one rank
    in this process; at several, `kiln train` launched: kiln.bench.train_llm.llm_train_ranks). The recipes
    are checked as kiln train's configs while the options are built."""

    name = "kiln"
    bench: Bench = "train-llm"

    def run(self, prepared: NothingPrepared, run: RowRun) -> list[TrainRow]:
        if run.ctx.nproc > 1:  # `kiln train` on the bench's ranks
            return [launched_kiln_row(run)]
        overrides = [*run.ctx.base_overrides, *run.spec.overrides]
        row = in_process_row(run, lambda stack: kiln_step(overrides, stack))
        row.overrides = list(run.spec.overrides)
        return [row]


KILN_ROWS = KilnRecipeRows()
