"""`kiln train`, the library side: from the parsed command line to an exit code and the lines to print.

`run_train` takes the loaded, validated config (the CLI loads it before importing any of this, so a
bad key exits 2 at once) and either launches a job of several processes (kiln.train.job) or trains
in this process (kiln.train.trainer): one process, or one rank that torchrun started. A failed run becomes its report (what failed,
where, what was kept, how to resume; kiln.train.failure) raised as RunFailed (exit 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kiln.config.schema import Config
from kiln.distributed.launch import LaunchSpec
from kiln.errors import ConfigError
from kiln.failure import RunFailed, quiet_child_signals
from kiln.failure.ranks import publish, under_kiln_launcher
from kiln.monitor.summary import summary_line
from kiln.train.job import Outcome, launch_job
from kiln.train.train_options import TrainOptions
from kiln.train.trainer import Trainer


@dataclass(frozen=True)
class TrainRequest:
    """`kiln train`'s command line, parsed."""

    config: str | None
    """--config: a TOML file; None: the defaults (passed on to a job's ranks, with the overrides)."""
    overrides: tuple[str, ...]
    """KEY=VALUE overrides, in command-line order."""
    run_dir: str | None
    verbose: bool
    launch: LaunchSpec | None
    """--nproc-per-node / several nodes: launch a job of ranks; None: train in this process."""
    on_run_dir: Callable[[Path], None]
    """Told the run dir once it is this run's (the CLI's dependencies.log and error.log go there)."""

    def rank_args(self) -> list[str]:
        """The `kiln train` arguments each rank of a launched job gets."""
        return ((["--verbose"] if self.verbose else []) + (["--config", self.config] if self.config else [])
                + list(self.overrides))


def train_request(options: TrainOptions, *, verbose: bool, on_run_dir: Callable[[Path], None]) -> TrainRequest:
    """The request `kiln train`'s flags make: a job of ranks with --nproc-per-node or several nodes."""
    launch = None
    if options.nproc_per_node is not None or options.nnodes > 1:
        launch = LaunchSpec(nproc_per_node=options.nproc_per_node if options.nproc_per_node is not None else 1,
                            nnodes=options.nnodes, node_rank=options.node_rank, rdzv_endpoint=options.rdzv_endpoint,
                            max_restarts=options.max_restarts, rdzv_wait_s=options.rdzv_wait)
    return TrainRequest(config=options.config, overrides=tuple(options.overrides), run_dir=options.run_dir,
                        verbose=verbose, launch=launch, on_run_dir=on_run_dir)


def run_train(cfg: Config, request: TrainRequest) -> Outcome:
    """The run (or the job) `request` asks for, with `cfg` loaded from its --config and overrides."""
    if request.launch is None:
        return train_here(cfg, request.run_dir, request.on_run_dir)
    return launch_job(cfg, request.launch, run_dir=request.run_dir, rank_args=request.rank_args(),
                      on_run_dir=request.on_run_dir)


def train_here(cfg: Config, run_dir: str | None, on_run_dir: Callable[[Path], None]) -> Outcome:
    """Train in this process (one process, or a rank of a torchrun job)."""

    def publish_early(exc: BaseException) -> None:  # under a launcher: the report before cleanup
        if trainer.dist.launched:
            publish(trainer.report(exc, final=False))

    # Builds model and data: bad paths/names also exit 2 here.
    trainer = Trainer(cfg, run_dir, on_failure=publish_early, keep_group_on_failure=True)
    on_run_dir(trainer.run_dir)  # built under the run dir's lock
    try:
        summary = trainer.fit()
    except BaseException as exc:
        if isinstance(exc, Exception) and not isinstance(exc, ConfigError):
            # Cleaned up, summary written: say what, where, what was kept.
            with quiet_child_signals():
                report = trainer.report(exc)
            # The process group is left once the message is out (see Trainer's keep_group_on_failure).
            raise RunFailed(report, after_report=trainer.leave_group) from exc
        trainer.leave_group()  # bad input, Ctrl-C, a stop signal: nothing to report here
        raise
    if not trainer.dist.is_main:
        return Outcome(0)
    if summary.get("already_complete"):
        return Outcome(0, [f"kiln: {trainer.run_dir} already holds the completed run of this config "
                           f"({summary['steps']} steps); nothing to do. Raise training.steps to train it longer, "
                           "or choose a new --run-dir to train again."])
    if under_kiln_launcher():  # the kiln launcher prints the summary line once for the job
        return Outcome(0)
    return Outcome(0, [summary_line(summary, trainer.run_dir)])
