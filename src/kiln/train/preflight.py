"""Checks a launcher runs before starting ranks, so bad input exits 2 once, in the parent,
before any rank spends time or writes anything."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from kiln.config.schema import Config
from kiln.data import build_data
from kiln.distributed.fsdp import fsdp_available
from kiln.distributed.launch import uses_gpu
from kiln.distributed.strategy import resolve_strategy
from kiln.errors import ConfigError
from kiln.models import build_model
from kiln.monitor.prometheus import check_bindable
from kiln.precision import resolve_precision
from kiln.train.gpu_plan import launcher_device_memory, plan_run
from kiln.train.rundir import check_run_dir

log = logging.getLogger("kiln.train")


def preflight(cfg: Config, run_dir: Path, world_size: int = 1, *, locked: bool = False) -> None:
    """Config was validated on load, and its measured compile defaults applied as the ranks will
    apply them (kiln.train.job); here: the run dir (another config's run there is refused, see
    kiln.train.rundir; `locked`: the caller holds the run dir's lock), the model factory and its
    arguments (built on the meta device: no memory, no compute), file data, and FSDP2 support."""
    check_run_dir(run_dir, cfg, cfg.checkpoint.resume, locked=locked)

    try:
        with torch.device("meta"):
            built = build_model(cfg.model)
    except ConfigError:
        raise
    except Exception as exc:  # some factories cannot build on meta; the ranks will build for real
        log.debug("preflight: model not built on meta (%s); ranks will check it", exc)
        built = None
    if cfg.data.source != "synthetic":
        build_data(cfg.data, built.input_spec if built else None, device=torch.device("cpu"), seed=cfg.training.seed)
    if cfg.metrics.prometheus:
        check_bindable(cfg.metrics.prometheus_host, cfg.metrics.prometheus_port)
    if uses_gpu(cfg.training.device) and cfg.distributed.strategy != "auto":  # auto asks a rank's device
        _plan_on_gpus(cfg, world_size)
    if cfg.distributed.strategy == "fsdp":
        if not fsdp_available():
            raise ConfigError("distributed.strategy", f"FSDP2 (fully_shard) is not in torch {torch.__version__}",
                              ("ddp", "auto"))


def _plan_on_gpus(cfg: Config, world_size: int) -> None:
    """The GPU memory plan against the GPUs' memory as NVML reports it: a run that cannot fit exits 2
    here, in seconds, before a rank starts (the ranks check again with their own device's figures)."""
    memory = launcher_device_memory(world_size)
    if memory is None:
        return
    policy = resolve_precision(cfg.precision.policy, torch.device("meta"))  # its dtypes; the ranks check the GPU
    strategy, _ = resolve_strategy(cfg, world_size, 0, 0, torch.device("meta"), launched=True)
    plan_run(cfg, strategy, world_size, policy, memory=memory, where="each GPU (NVML, before starting ranks)",
             announce=False)
