"""NaN/inf guard: catch a non-finite loss or gradient norm at the step it happens, with no host sync
per step.

Each step produces a device bool `flag` (loss or grad norm non-finite) and the guard folds it into
device counters (how many, the first bad step, the current run of consecutive bad steps, the step
at which that run reached the limit) with `torch.where` — no `.item()`. The host looks at them
once per log interval (`check()`) and before every checkpoint, so a non-finite state is never
saved. Policies (training.nonfinite):

- `error`: the update is applied as usual; `check()` raises NonFiniteError naming the first bad
  step. Steps after it until the check may run on NaN weights; nothing is saved from them.
- `skip`: the update is dropped on the device, then `check()` raises once
  `training.nonfinite_max_skips` consecutive steps were bad. `step_optimizer` drops the update:
  * fused AdamW/Adam/SGD (the CUDA default): the optimizer's `found_inf` input, the mechanism
    GradScaler uses (torch/amp/grad_scaler.py `_step`; torch/optim/adam.py `_fused_adam`): the fused
    kernel leaves params, moments and the step count untouched when it is set — no sync;
  * with a GradScaler: the flag is added to the scaler's found-inf record for this optimizer, so
    scaler.step skips the update (and scaler.update backs off the scale, as for an overflow);
  * any other optimizer (foreach/for-loop kernels take no found_inf): one host read of the flag per
    step, in `skip` mode only. Use a fused optimizer (optim.fused=true) to avoid it.
  The LR schedule still advances on a skipped step (as with GradScaler's skipped steps).

Under DDP/FSDP the loss differs per rank, so in `skip` mode the flag is all-reduced (MAX, on the
device) each step: every rank must drop the same updates or replicas drift apart. In `error` mode
`check()` reduces the counters instead, so all ranks raise together.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

log = logging.getLogger("kiln.checkpoint")

POLICIES = ("error", "skip")
_NONE = torch.iinfo(torch.int64).max  # "no such step yet"; MIN-reductions ignore it


class NonFiniteError(RuntimeError):
    """Training produced a non-finite loss or gradient norm; `step` is where it happened."""

    def __init__(self, step: int, message: str) -> None:
        super().__init__(message)
        self.step = step


def _local(t: Tensor) -> Tensor:
    """The full value of a DTensor (FSDP2's clip_grad_norm_ returns one), else `t`."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


class NonFiniteGuard:
    def __init__(self, policy: str, max_skips: int, *, device: torch.device | str = "cpu",
                 process_group=None, window: int = 64) -> None:
        if policy not in POLICIES:
            raise ValueError(f"training.nonfinite must be one of {POLICIES}, got {policy!r}")
        self.policy = policy
        self.max_skips = max(1, int(max_skips))
        self.device = torch.device(device)
        self.group = process_group
        self.distributed = dist.is_available() and dist.is_initialized()
        self.reported = 0
        self.counting = policy == "skip"
        """Per-step device counters (skip mode, and any step captured in a CUDA graph) instead of
        the row buffer `error` mode uses otherwise."""
        self._reset(0, 0)
        # `error` needs no per-step decision, only the first bad step when the host looks: each step
        # stores (loss, grad norm) in a row of a device buffer (one kernel; the flag/counter
        # arithmetic of `skip` is ~25 kernels, a visible share of a launch-bound step), checked at log
        # intervals. `window` is the expected number of steps between checks; it grows if needed.
        self._rows = torch.zeros((max(1, window), 2), dtype=torch.float32, device=self.device)
        self._row_steps: list[int] = []

    @property
    def needs_flag(self) -> bool:
        """Whether the step must compute a per-step flag (`skip` drops updates; counters need it)."""
        return self.counting

    def use_counters(self) -> None:
        """Keep device counters in `error` mode too: a CUDA graph replays the same kernels every
        step, so it cannot write a new row of the buffer each time (the row index is a host
        value); the counters take the step number from a device tensor instead."""
        self.counting = True

    def _reset(self, count: int, run: int) -> None:
        def full(value: int) -> Tensor:
            return torch.full((), value, dtype=torch.int64, device=self.device)

        self._count, self._run = full(count), full(run)
        self._first, self._last, self._limit = full(_NONE), full(_NONE), full(_NONE)

    # -- per step (device only) ----------------------------------------------------------------
    def flag(self, loss: Tensor, grad_norm: Tensor | None = None) -> Tensor:
        """Device bool: this step's loss or grad norm is not finite. Pass `grad_norm=None` under a
        GradScaler: its overflow steps are routine, handled by the scaler, not divergence."""
        bad = ~torch.isfinite(_local(loss).detach()).all()
        if grad_norm is not None:
            bad = bad | ~torch.isfinite(_local(grad_norm).detach()).all()
        if self.policy == "skip" and self.distributed:
            vote = bad.to(torch.int32)
            dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self.group)
            bad = vote > 0
        return bad

    def observe(self, loss: Tensor, grad_norm: Tensor | None, step: int | Tensor, *,
                flag: Tensor | None = None) -> Tensor:
        """Record step `step` (a host int, or a device int64 tensor inside a CUDA graph); returns its
        flag (None in `error` mode without counters, which decides at check()). Pass `flag` when the
        step already computed it."""
        if not self.counting:
            i = len(self._row_steps)
            if i == self._rows.shape[0]:
                self._rows = torch.cat([self._rows, torch.zeros_like(self._rows)])
            value = _local(loss).detach().reshape(())
            other = _local(grad_norm).detach().reshape(()) if grad_norm is not None else value
            torch.stack([value.to(self._rows), other.to(self._rows)], out=self._rows[i])
            self._row_steps.append(step)
            return flag
        if flag is None:
            flag = self.flag(loss, grad_norm)
        flag = flag.to(self.device)
        bad = flag.to(torch.int64)
        # In place: a CUDA graph replays these kernels on the same tensors every step.
        self._count.add_(bad)
        self._run.add_(1).mul_(bad)  # back to 0 on a finite step
        self._first.copy_(torch.where(flag & (self._first == _NONE), step, self._first))
        self._last.copy_(torch.where(flag, step, self._last))
        self._limit.copy_(torch.where((self._run >= self.max_skips) & (self._limit == _NONE), step, self._limit))
        return flag

    def step_optimizer(self, optimizer: torch.optim.Optimizer, flag: Tensor,
                       scaler: torch.amp.GradScaler | None = None) -> None:
        """Use in place of `optimizer.step()` (or `scaler.step(optimizer); scaler.update()`): in `skip`
        mode the update is dropped when `flag` is set (see the module docstring for how)."""
        if self.policy != "skip":
            _plain_step(optimizer, scaler)
            return
        if scaler is not None:
            record = _scaler_found_inf(scaler, optimizer)
            if record is not None:
                for found in record.values():
                    found.add_(flag.to(found.device, found.dtype))
                scaler.step(optimizer)
                scaler.update()
                return
        elif getattr(optimizer, "_step_supports_amp_scaling", False):  # fused kernels
            optimizer.found_inf = flag.to(torch.float32)  # type: ignore[attr-defined]
            optimizer.grad_scale = None  # type: ignore[attr-defined]
            try:
                optimizer.step()
            finally:
                del optimizer.found_inf, optimizer.grad_scale  # type: ignore[attr-defined]
            return
        if not bool(flag):  # the documented fallback: a host read per step, skip mode only
            _plain_step(optimizer, scaler)
        elif scaler is not None:
            scaler.update()

    # -- at log intervals and before checkpoints (one host read) ---------------------------------
    def check(self) -> dict[str, int]:
        """Raise NonFiniteError per the policy; else return counters for the metrics record.
        Under a process group, call on every rank at the same steps (it is collective)."""
        if not self.counting:
            return self._check_rows()
        values = torch.stack([self._first, -self._count, self._limit, -self._run, -self._last])
        if self.distributed and self.policy == "error":
            dist.all_reduce(values, op=dist.ReduceOp.MIN, group=self.group)
        first, neg_count, limit, neg_run, neg_last = values.tolist()
        count, run, last = -neg_count, -neg_run, -neg_last
        if self.policy == "error" and count > 0:
            raise NonFiniteError(first, f"non-finite loss or gradient norm at step {first} (training.nonfinite=error); "
                                        "no checkpoint was written after it")
        if limit != _NONE:
            raise NonFiniteError(limit, f"{self.max_skips} consecutive non-finite steps, the last at step {limit} "
                                        f"(training.nonfinite=skip, nonfinite_max_skips={self.max_skips})")
        if count > self.reported:
            log.warning("skipped %d non-finite step(s) since the last report (first at step %d, latest at step %d)",
                        count - self.reported, first, last)
            self.reported = count
        return {"nonfinite_skipped": count, "nonfinite_consecutive": run}

    def _check_rows(self) -> dict[str, int]:
        first = _NONE
        if self._row_steps:
            bad = (~torch.isfinite(self._rows[: len(self._row_steps)])).any(dim=1)
            hits = torch.nonzero(bad).flatten().tolist()  # the one host read, at a log interval
            if hits:
                first = self._row_steps[hits[0]]
        self._row_steps = []
        if self.distributed:
            vote = torch.tensor([first], dtype=torch.int64, device=self.device)
            dist.all_reduce(vote, op=dist.ReduceOp.MIN, group=self.group)
            first = int(vote.item())
        if first != _NONE:
            raise NonFiniteError(first, f"non-finite loss or gradient norm at step {first} (training.nonfinite=error); "
                                        "no checkpoint was written after it")
        return {"nonfinite_skipped": 0, "nonfinite_consecutive": 0}

    # -- checkpointed with the run ------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        count, run = torch.stack([self._count, self._run]).tolist()
        return {"skipped_total": int(count), "consecutive_skips": int(run)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reset(int(state.get("skipped_total", 0)), int(state.get("consecutive_skips", 0)))
        self.reported = int(state.get("skipped_total", 0))


def _plain_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> None:
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


def _scaler_found_inf(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> dict | None:
    """The scaler's per-device found-inf tensors for `optimizer`, unscaling first if needed.
    GradScaler keeps them in `_per_optimizer_states` (torch 2.6 .. 2.13); None if that changes."""
    states = getattr(scaler, "_per_optimizer_states", None)
    if states is None or not scaler.is_enabled():
        return None
    if not states[id(optimizer)].get("found_inf_per_device"):
        scaler.unscale_(optimizer)
    record = states[id(optimizer)].get("found_inf_per_device")
    return record or None
