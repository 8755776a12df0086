"""Build and check everything of a run that can fail on bad input, so a mistake costs no compute and
writes nothing: the checkpointer and the resume decision, the host-memory check, the model, the
strategy, the data, the features (the config-level facts were settled by kiln.train.plan).

`build_run` runs under the run dir's lock (the trainer takes it first) and returns `RunParts`, the
read-only inputs of the loop (kiln.train.loop) and of the run's opening and end.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from kiln.checkpoint import Checkpointer, config_digest
from kiln.checkpoint.hf_export import tokenizer_dir_of
from kiln.config.schema import Config
from kiln.cpu.threads import CpuPlan
from kiln.data import build_data
from kiln.data.base import DataSource
from kiln.data.special_tokens import align_config
from kiln.distributed.world import DistEnv
from kiln.errors import ConfigError
from kiln.failure.faults import Fault
from kiln.models import BuiltModel, build_model
from kiln.precision import PrecisionPolicy, apply_precision
from kiln.runtime import seed_everything
from kiln.train.features import Features, resolve_features
from kiln.train.gpu_memory import GpuPlan
from kiln.train.gpu_plan import device_memory, planned_checkpointing
from kiln.train.memory_plan import check_run_fits, meta_model
from kiln.train.plan import Placement, TrainPlan, plan_device_memory
from kiln.train.resume import Resume, decide_resume
from kiln.train.strategy import resolve_strategy

log = logging.getLogger("kiln.train")


@dataclass(frozen=True)
class RunParts:
    """What one process trains with, built and checked before any work."""

    cfg: Config
    run_dir: Path
    dist: DistEnv
    device: torch.device
    policy: PrecisionPolicy
    cpu_plan: CpuPlan | None
    fault: Fault | None
    """KILN_FAULT's fault for this rank (kiln.failure.faults), injected by the loop."""
    checkpointer: Checkpointer
    resume: Resume
    built: BuiltModel
    model: torch.nn.Module
    """`built.module` on the device, cast to the precision policy; under FSDP2 (where
    `built.initial_values` is set) still on the meta device: kiln.train.assemble shards it, then
    allocates and fills each rank's shards (kiln.distributed.materialise)."""
    num_params: int
    strategy: str
    strategy_reason: str
    train_data: DataSource
    """Its batches' sizes: `samples_per_batch`, `tokens_per_batch` (None unless tokens)."""
    eval_data: DataSource | None
    features: Features
    tokenizer_dir: Path | None
    """The tokenizer directory of prepared token data (kiln.checkpoint.hf_export.tokenizer_dir_of)."""
    memory_plan: GpuPlan | None
    """The device memory plan per rank (kiln.train.gpu_plan); None when the model cannot be built on meta."""


def build_run(plan: TrainPlan, where: Placement, dist: DistEnv, device: torch.device, *,
              cpu_plan: CpuPlan | None, fault: Fault | None) -> RunParts:
    """Everything that can fail on bad input (ConfigError: exit 2), in the order a mistake is cheapest
    to find: the run dir's run, the host memory, the model, the data, the features."""
    cfg, run_dir, policy = plan.cfg, plan.run_dir, plan.policy
    ckpt = cfg.checkpoint
    if ckpt.async_save and dist.world_size > 1 and device.type == "cpu":
        # Seen with torch 2.13 (DDP and FSDP2): an async save's DCP collectives (a gloo group of its
        # own, in DCP's thread) and the training's gloo collectives both waited until the timeout.
        # NCCL training does not share the hang; the Checkpointer alone, beside gloo steps, does not either.
        if dist.is_main:
            log.warning("checkpoint.async_save=true on gloo (CPU) ranks: saving in the foreground (an async save "
                        "beside gloo training collectives hung); NCCL runs save in the background")
        ckpt = dataclasses.replace(ckpt, async_save=False)
    checkpointer = Checkpointer(run_dir, ckpt, rank=dist.rank, world_size=dist.world_size,
                                config_digest=config_digest(cfg))
    resume = decide_resume(cfg, run_dir, checkpointer, is_main=dist.is_main)
    check_run_fits(cfg, device.type)  # before building a model (or a batch) the host cannot hold
    shape = meta_model(cfg)  # shapes only: the strategy and the GPU plan before any allocation
    guess = memory_plan = None
    if shape is not None:  # exit 2 here when the device cannot hold the run
        label = f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)
        guess, memory_plan = plan_device_memory(cfg, shape, policy, where, device, memory=device_memory(device),
                                                device_label=label, announce=dist.is_main and device.type == "cuda")
    seed_everything(cfg.training.seed)  # same seed on every rank: identical initial weights
    # Sharded before its weights exist when FSDP2 will shard it and its weights can be made one
    # parameter at a time (kiln's decoder): built whole on each rank's device first, an 8B model
    # took its 32 GB of fp32 weights on every GPU before FSDP2 sharded them.
    on_meta = guess == "fsdp" and shape.initial_values is not None
    built = shape if on_meta else build_model(cfg.model, device=device)
    num_params = sum(p.numel() for p in built.module.parameters())
    param_bytes = torch.finfo(policy.param_dtype).bits // 8
    strategy, strategy_reason = resolve_strategy(cfg, dist.world_size, num_params, param_bytes, device,
                                                 launched=dist.launched)
    if on_meta and strategy != "fsdp":  # the same resolver's answer as the guess above; a guard all the same
        raise RuntimeError(f"the model was built on the meta device for FSDP2, but the strategy is {strategy}")
    # The tokenizer prepared token data names: its BOS/EOS for the model, its files for the run dir.
    tokenizer_dir = tokenizer_dir_of(cfg.data.path) if cfg.data.source == "tokens" else None
    if built.hf_config is not None and cfg.data.source == "tokens":  # the data's BOS/EOS, not a preset's
        built.hf_config, changed = align_config(built.hf_config, tokenizer_dir, explicit=cfg.model.kwargs)
        if changed and dist.is_main:
            log.info("special tokens from the data's tokenizer: %s",
                     ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items()))
    if resume.path is not None:  # a checkpoint of another model is bad input: exit 2, nothing written
        checkpointer.check_model(resume.path, built.module)
    model = apply_precision(built.module if on_meta else built.module.to(device), policy)
    shard = {"rank": dist.rank, "world_size": dist.world_size}
    train_data = build_data(cfg.data, built.input_spec, device=device, seed=cfg.training.seed, **shard)
    eval_data = None
    if cfg.training.eval_interval > 0:
        eval_data = build_data(cfg.data, built.input_spec, device=device, seed=cfg.training.seed, split="eval",
                               **shard)
        if eval_data is None:
            log.warning("training.eval_interval is set but data has no eval split (data.eval_path); eval is off")
    if cfg.compile.enabled and cfg.compile.regional and not built.blocks:
        raise ConfigError("compile.regional", f"{cfg.model.name} has no repeated blocks to compile one by one")
    features = resolve_features(cfg, built, model, policy, device, train_data,
                                checkpointing=planned_checkpointing(memory_plan, cfg.training.activation_checkpointing))
    return RunParts(cfg=cfg, run_dir=run_dir, dist=dist, device=device, policy=policy, cpu_plan=cpu_plan,
                    fault=fault, checkpointer=checkpointer, resume=resume, built=built, model=model,
                    num_params=num_params, strategy=strategy, strategy_reason=strategy_reason,
                    train_data=train_data, eval_data=eval_data, features=features,
                    tokenizer_dir=tokenizer_dir, memory_plan=memory_plan)
