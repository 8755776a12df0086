"""`kiln train [--config FILE.toml] [--run-dir DIR] [--nproc-per-node N ...] [KEY=VALUE ...]`."""

from __future__ import annotations

import argparse
import signal
import sys

from kiln.cli.args import add_verbose_flag


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a model (default: the seed MLP on synthetic data, short run)",
        description="Train a model. Overrides use dotted config keys, e.g. training.steps=50 compile.enabled=true",
    )
    p.add_argument("--config", help="TOML config file (see configs/); defaults apply to missing keys")
    p.add_argument("--run-dir", help="output directory (default: runs/<time>-<model>); the same command again continues "
                   "a run that crashed there (checkpoint.resume=auto)")
    add_verbose_flag(p)
    d = p.add_argument_group("distributed (runs torchrun for you; `torchrun -m kiln train ...` works too)")
    d.add_argument("--nproc-per-node", type=int, help="processes on this node (one per GPU; gloo ranks on CPU)")
    d.add_argument("--nnodes", type=int, default=1, help="number of nodes")
    d.add_argument("--node-rank", type=int, help="this node's rank (0 on the rendezvous host)")
    d.add_argument("--rdzv-endpoint", help="HOST:PORT of node rank 0, for several nodes")
    d.add_argument("--max-restarts", type=int, default=0, help="restart the group up to K times after a failure")
    d.add_argument("--rdzv-wait", type=float, default=30.0, help="seconds a non-zero node waits for the endpoint")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="config overrides, anywhere on the command line; applied after --config, later ones win")
    p.set_defaults(run=run)


def _launch(args: argparse.Namespace, cfg) -> int:
    from kiln.distributed.launch import LaunchSpec, check_launch
    from kiln.failure import RunFailed
    from kiln.failure.faults import planned_fault
    from kiln.outputs import RunDirLock
    from kiln.train.rundir import choose_run_dir

    spec = LaunchSpec(
        nproc_per_node=args.nproc_per_node if args.nproc_per_node is not None else 1,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        max_restarts=args.max_restarts,
        rdzv_wait_s=args.rdzv_wait,
    )
    run_dir, continuing = choose_run_dir(cfg, args.run_dir)
    if continuing:
        print(f"kiln: continuing the unfinished run of this config in {run_dir} (pass --run-dir NEW_DIR to start a "
              "new run instead)", file=sys.stderr)
    check_launch(spec, cfg.training.device)
    planned_fault(0)  # a malformed KILN_FAULT is bad input, before the run dir is created
    # Node rank 0's launcher holds the run dir's lock for its ranks from before the checks until the
    # job's report is written: a refused launcher starts nothing and touches nothing there.
    owner = (spec.node_rank or 0) == 0
    lock = RunDirLock(run_dir)
    if owner:
        lock.acquire()
    try:
        code = _launch_locked(args, cfg, spec, run_dir, lock if owner else None)
    except RunFailed as exc:  # the report (error.log) is written into the run dir under the lock
        exc.after_report = lock.release
        raise
    except BaseException:
        lock.release(remove_if_created=True)
        raise
    lock.release()
    return code


def _launch_locked(args: argparse.Namespace, cfg, spec, run_dir, lock) -> int:
    import os

    from kiln.distributed.launch import launch, launcher_flags, uses_gpu
    from kiln.failure import RunFailed
    from kiln.failure.ranks import first_failure
    from kiln.monitor.summary import read_summary
    from kiln.outputs import LOCK_ENV
    from kiln.train.failure import group_report, resume_command
    from kiln.train.preflight import preflight

    preflight(cfg, run_dir, spec.nproc_per_node * spec.nnodes, locked=lock is not None)
    args.output_dir = run_dir  # checked under the lock: the run's dir, dependencies.log goes there
    passthrough = (["--verbose"] if args.verbose else []) + (["--config", args.config] if args.config else [])
    passthrough += list(args.overrides)
    if spec.max_restarts > 0 and cfg.checkpoint.resume == "never":
        # A restarted group must continue from the last checkpoint, not start over (the parent
        # checked the run dir above; an elastic restart skips that check).
        passthrough.append("checkpoint.resume=auto")
    env = {}
    if not uses_gpu(cfg.training.device):  # CPU ranks: threads per rank, not torchrun's 1
        from kiln.cpu.threads import launcher_env

        env = launcher_env(cfg.cpu, spec.nproc_per_node)
    if lock is not None:
        env[LOCK_ENV] = f"{os.getpid()}:{os.path.abspath(run_dir)}"
    result = launch(spec, run_dir, passthrough, env)
    resume = resume_command(run_dir, launcher_flags(spec))
    if result.code == 0:
        summary = read_summary(run_dir)
        print(summary_line(summary, run_dir) if summary else f"kiln: completed; run dir {run_dir}")
        if result.stopped_by is not None:
            print(stopped_line(result.stopped_by, summary, run_dir, resume))
        return 0
    if result.stopped_by is not None and all(_ended_by(f, result.stopped_by) for f in result.failures):
        # The ranks died of the signal itself: it came before they trained (nothing of this run to
        # save yet) or a second one said "now". Not a failure: say what is kept.
        print(stopped_line(result.stopped_by, None, run_dir, resume, saved=False))
        return 128 + signal.Signals[result.stopped_by].value
    # The ranks said one line each at most; name the first failure, what was kept, what to do.
    raise RunFailed(group_report(run_dir, first_failure(result.failures), result.failures, launcher_flags(spec),
                                 owner=lock is not None))


def summary_line(summary: dict, run_dir) -> str:
    """The one line a finished (or stopped) run ends with: steps, loss, speed, run dir."""
    if summary.get("first_loss") is None or summary.get("final_loss") is None:
        return f"kiln: {summary.get('status', 'completed')} {summary.get('steps', 0)} steps; run dir {run_dir}"
    rate = summary.get("tokens_per_s") and f"{summary['tokens_per_s']:.0f} tokens/s" or (
        f"{summary.get('samples_per_s') or 0:.0f} samples/s"
    )
    resumed = f" (resumed: {len(summary['segments'])} segments)" if summary.get("resumed") else ""
    return (f"kiln: {summary['status']} {summary['steps']} steps{resumed}, loss {summary['first_loss']:.4f} -> "
            f"{summary['final_loss']:.4f}, {summary['step_ms_median']:.2f} ms/step, {rate}; run dir {run_dir}")


def _ended_by(failure, signal_name: str) -> bool:
    """Whether a failed rank only ended because of the stop signal: killed by it, or exiting as kiln
    does on a second one (KeyboardInterrupt: 130, SystemExit: 128 + the signal)."""
    if failure.kiln.get("kind"):
        return False  # the rank reported an error of its own
    return failure.signal_name == signal_name or failure.exitcode == 128 + signal.Signals[signal_name].value


def stopped_line(signal_name: str, summary: dict | None, run_dir, command: str, *, saved: bool = True) -> str:
    """What a stop signal did to a multi-process run: which checkpoint is kept, how to continue.
    `saved`: the ranks stopped as asked (each saved its part of a checkpoint at the step they agreed on)."""
    from kiln.checkpoint.storage import newest_intact

    if saved and summary is not None and summary.get("status") != "stopped":  # it came as the run ended
        return f"kiln: {signal_name} arrived as the run ended; nothing to continue"
    # The ranks have just written it (and checksummed it): sizes, not a second read of every byte.
    newest = newest_intact(run_dir / "checkpoints", hashes=False)
    if saved and newest is not None:
        return (f"kiln: stopped by {signal_name}: every rank saved its part of checkpoint {newest}; "
                f"the same command continues the run, as does: {command}")
    if newest is None:
        return (f"kiln: stopped by {signal_name} before any checkpoint of this run was saved; the same command "
                "starts it again")
    return (f"kiln: stopped by {signal_name} before the ranks saved; the newest complete checkpoint is {newest}: "
            f"the same command continues from there, as does: {command}")


def run(args: argparse.Namespace) -> int:
    from kiln.config import load_config
    from kiln.config.errors import ConfigError

    cfg = load_config(args.config, args.overrides)  # ConfigError -> exit 2 before any work
    if args.nproc_per_node is not None or args.nnodes > 1:
        return _launch(args, cfg)

    from kiln.failure import RunFailed, quiet_child_signals
    from kiln.failure.ranks import publish, under_kiln_launcher
    from kiln.train.failure import training_report
    from kiln.train.trainer import Trainer

    def publish_early(exc: BaseException) -> None:  # under a launcher: the report before cleanup
        if trainer.dist.launched:
            publish(training_report(trainer, exc, final=False))

    # Builds model and data: bad paths/names also exit 2 here.
    trainer = Trainer(cfg, args.run_dir, on_failure=publish_early, keep_group_on_failure=True)
    args.output_dir = trainer.run_dir  # built under the run dir's lock: dependencies.log (kiln.noise) lands there
    try:
        summary = trainer.fit()
    except Exception as exc:  # cleaned up, summary written: say what, where, what was kept
        if isinstance(exc, ConfigError):
            trainer.leave_group()
            raise
        with quiet_child_signals():
            report = training_report(trainer, exc)
        # The process group is left once the message is out (see Trainer's keep_group_on_failure).
        raise RunFailed(report, after_report=trainer.leave_group) from exc
    except BaseException:
        trainer.leave_group()
        raise
    if not trainer.dist.is_main:
        return 0
    if summary.get("already_complete"):
        print(f"kiln: {trainer.run_dir} already holds the completed run of this config ({summary['steps']} steps); "
              "nothing to do. Raise training.steps to train it longer, or choose a new --run-dir to train again.")
        return 0
    if not under_kiln_launcher():  # the kiln launcher prints this line once for the job
        print(summary_line(summary, trainer.run_dir))
    return 0
