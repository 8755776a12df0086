"""Checks a launcher runs before starting ranks, so bad input exits 2 once, in the parent,
before any rank spends time or writes anything."""

from __future__ import annotations

import torch

from kiln.config.schema import Config
from kiln.data import build_data
from kiln.distributed.fsdp import fsdp_available
from kiln.distributed.launch import uses_gpu
from kiln.errors import ConfigError
from kiln.models.spec import BuiltModel
from kiln.precision import PrecisionPolicy
from kiln.train.gpu_plan import launcher_device_memory
from kiln.train.memory_plan import meta_model
from kiln.train.plan import Placement, TrainPlan, plan_device_memory
from kiln.train.rundir import check_run_dir


def preflight(plan: TrainPlan, where: Placement, *, locked: bool = False) -> None:
    """The plan's config was validated on load, and its measured compile defaults applied as the
    ranks will apply them (kiln.train.plan); here: the run dir (another config's run there is
    refused, see kiln.train.rundir; `locked`: the caller holds the run dir's lock), the model factory
    and its arguments (built on the meta device: no memory, no compute; a factory that cannot build
    there is left to the ranks) and the GPU memory plan, file data, and FSDP2 support."""
    cfg = plan.cfg
    check_run_dir(plan.run_dir, cfg, cfg.checkpoint.resume, locked=locked)
    shape = meta_model(cfg)
    if uses_gpu(cfg.training.device) and cfg.distributed.strategy != "auto":  # auto asks a rank's device
        _plan_on_gpus(cfg, shape, plan.policy, where)
    if cfg.data.source != "synthetic":
        build_data(cfg.data, shape.input_spec if shape else None, device=torch.device("cpu"), seed=cfg.training.seed)
    if cfg.distributed.strategy == "fsdp":
        if not fsdp_available():
            raise ConfigError("distributed.strategy", f"FSDP2 (fully_shard) is not in torch {torch.__version__}",
                              ("ddp", "auto"))


def _plan_on_gpus(cfg: Config, shape: BuiltModel | None, policy: PrecisionPolicy, where: Placement) -> None:
    """The GPU memory plan against the GPUs' memory as NVML reports it: a run that cannot fit exits 2
    here, in seconds, before a rank starts (the ranks check again with their own device's figures)."""
    memory = launcher_device_memory(where.world_size)
    if memory is None:
        return
    plan_device_memory(cfg, shape, policy, where, torch.device("meta"), memory=memory,
                       device_label="each GPU (NVML, before starting ranks)", announce=False)
