"""Checkpoints: DCP save/load with atomic completion, retention, resume, export, NaN guard, signals.

The same calls serve one process, DDP and FSDP2; call them on every rank, in this order:

    ck = Checkpointer(run_dir, cfg.checkpoint, rank=r, world_size=w, config_digest=config_digest(cfg))
    resume = ck.resolve_resume(cfg.checkpoint.resume)     # before any work: a bad path is exit 2
    guard = NonFiniteGuard(cfg.training.nonfinite, cfg.training.nonfinite_max_skips, device=device)
    app = AppState(model, optimizer, scheduler, scaler, data=train_data, guard=guard,
                   rank=r, world_size=w, device=device)
    # after build/apply/compile/FLOP counting (they consume RNG and batches), before step 1:
    if resume: ck.load(resume, app); start = app.progress["step"] + 1   # drop prefetched batches
    with StopOnSignal() as stop:
        for step in range(start, steps + 1):
            # in the step: grad norm every step; flag = guard.flag(loss, None if scaler else norm);
            # guard.step_optimizer(optimizer, flag, scaler) instead of optimizer/scaler .step()
            guard.observe(loss, norm, step, flag=flag)
            app.progress.update(step=step, samples_seen=..., tokens_seen=...)
            if is_log_step: record.update(guard.check())        # NonFiniteError -> exit 1
            if interval and step % interval == 0: ck.save(step, app)
            if any_rank(stop.stop_requested()): ck.save(step, app, block=True); break
        else:
            if cfg.checkpoint.save_final: ck.save(steps, app, final=True)
    ck.close()   # in `finally`: completes an in-flight async save

These names load on first use (`__getattr__`): importing the package itself imports no torch, so
its torch-free modules (export_request, read by `kiln --help`) stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.config.identity import config_digest

if TYPE_CHECKING:
    from kiln.checkpoint.manager import Checkpointer, LoadReport, latest_complete
    from kiln.checkpoint.nonfinite import NonFiniteError, NonFiniteGuard
    from kiln.checkpoint.signals import StopOnSignal, any_rank
    from kiln.checkpoint.state import AppState
    from kiln.checkpoint.storage import CheckpointSaveError

__all__ = [
    "AppState",
    "CheckpointSaveError",
    "Checkpointer",
    "LoadReport",
    "NonFiniteError",
    "NonFiniteGuard",
    "StopOnSignal",
    "any_rank",
    "config_digest",
    "latest_complete",
]


def __getattr__(name: str) -> Any:
    """One of `__all__`, from its module (imported, with torch, on the first use of any)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from kiln.checkpoint import manager, nonfinite, signals, state, storage

    value = getattr(next(m for m in (manager, nonfinite, signals, state, storage) if hasattr(m, name)), name)
    globals()[name] = value
    return value
