"""The plan of a training run: what its config decides, resolved once, before any work.

`plan_train` is the one function that turns a loaded config into the run's facts: the measured
compile defaults applied for where the run trains (kiln.train.compile_defaults; before the run dir
is compared with the config), and the run dir (kiln.train.rundir `choose_run_dir`: --run-dir, the
unfinished run of this config under `runs/`, or a new one). A job's launcher (kiln.train.job) and
each of its ranks (kiln.train.trainer) call it with their `Placement`, so both decide alike; it
also resolves the precision policy and checks the metrics choices (tracker, Prometheus address).
`plan_device_memory` is the device memory plan both make: the strategy a model of its shape gets,
and the per-rank plan under it (kiln.train.gpu_plan), refused when it cannot fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kiln.compile import cuda_graph_mode_note
from kiln.config.schema import Config
from kiln.models.spec import BuiltModel
from kiln.monitor.prometheus import check_bindable
from kiln.monitor.trackers import check_tracker
from kiln.precision import PrecisionPolicy, resolve_precision
from kiln.train.compile_defaults import apply_measured_defaults
from kiln.train.gpu_memory import GpuPlan
from kiln.train.gpu_plan import plan_run
from kiln.train.rundir import choose_run_dir
from kiln.train.strategy import resolve_strategy


@dataclass(frozen=True)
class Placement:
    """Where a run trains, as far as its plan needs to know."""

    device_type: str
    """`cuda` or `cpu` (the launcher's guess for its ranks, or a rank's own device)."""
    world_size: int
    launched: bool
    """Under torchrun (kiln's launcher or a plain one)."""
    device_name: str | None = None
    """The CUDA device's name, to say when it is not the GPU a compile recipe was measured on."""
    is_main: bool = True
    """This process speaks for the run (rank 0, or a launcher): it checks the Prometheus address."""


@dataclass(frozen=True)
class TrainPlan:
    """The run's config-level facts, decided once."""

    cfg: Config
    """The config with the measured compile defaults applied (as its config.toml will say)."""
    run_dir: Path
    continuing: bool
    """The run dir is an unfinished run of this config found under `runs/` (no --run-dir given)."""
    compile_note: str | None
    """What the measured compile defaults did (a log line), or None."""
    policy: PrecisionPolicy
    """The precision policy (its dtypes; on a rank's GPU, also checked against it)."""
    graph_note: str | None
    """What a CUDA-graph compile mode does off CUDA (kiln.compile.cuda_graph_mode_note; a warning), or None."""

    def continuing_line(self) -> str:
        """What a continued run says first."""
        return (f"continuing the unfinished run of this config in {self.run_dir} (pass --run-dir NEW_DIR to start a "
                "new run instead)")


def plan_train(cfg: Config, run_dir: str | Path | None, where: Placement, device: torch.device) -> TrainPlan:
    """The run's plan: its compile defaults for `where`, its run dir (`run_dir`: --run-dir), its
    precision policy checked on `device` (a rank's own; the launcher's is `meta`: it opens no CUDA
    context), its metrics checked (the tracker installed, the Prometheus address free)."""
    note = apply_measured_defaults(cfg, where.device_type, where.world_size, launched=where.launched,
                                   device_name=where.device_name)
    chosen, continuing = choose_run_dir(cfg, run_dir)
    policy = resolve_precision(cfg.precision.policy, device)
    check_tracker(cfg.metrics.tracker)  # a tracker that is not installed: exit 2 before any work
    if cfg.metrics.prometheus and where.is_main:
        check_bindable(cfg.metrics.prometheus_host, cfg.metrics.prometheus_port)
    return TrainPlan(cfg=cfg, run_dir=chosen, continuing=continuing, compile_note=note, policy=policy,
                     graph_note=cuda_graph_mode_note(cfg.compile, where.device_type))


def plan_device_memory(cfg: Config, shape: BuiltModel | None, policy: PrecisionPolicy, where: Placement,
                       device: torch.device, *, memory: tuple[int, int] | None, device_label: str,
                       announce: bool) -> tuple[str, GpuPlan | None]:
    """(the strategy a model of `shape` gets, its device memory plan per rank: None when the model
    cannot be built on the meta device, `shape` None); ConfigError (exit 2) when `memory` = (free,
    total) bytes is given and the plan does not fit (`device_label` says where)."""
    params = sum(p.numel() for p in shape.module.parameters()) if shape is not None else 0
    strategy, _ = resolve_strategy(cfg, where.world_size, params, torch.finfo(policy.param_dtype).bits // 8, device,
                                   launched=where.launched)
    return strategy, plan_run(cfg, strategy, where.world_size, policy, memory=memory, where=device_label,
                              announce=announce)
