"""The training step: forward (+loss) -> backward -> (unscale) -> clip -> optimizer -> scheduler.

Nothing here reads a device value on the host: the loss and gradient norm come back as device
tensors, and the trainer reads them at log intervals only, so the CPU can run ahead of the GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import Tensor

from kiln.compile import compile_function
from kiln.config.schema import CompileConfig
from kiln.distributed.env import all_reduce_sum


class TrainStep:
    """One optimizer step over `grad_accum_steps` micro-batches.

    Call with a list of `(inputs, targets)` micro-batches; returns `(mean_loss, grad_norm, flag)`
    as device tensors: `grad_norm` is None when neither clipping, the non-finite guard nor the
    caller needs it; `flag` (a device bool: loss or gradient norm not finite) is None without a
    guard. With a guard in `skip` mode a non-finite update is dropped on the device.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        forward_loss: Callable[[Tensor, Tensor], Tensor],
        optimizer: torch.optim.Optimizer,
        scheduler,
        *,
        grad_clip: float,
        scaler: torch.amp.GradScaler | None = None,
        compile_cfg: CompileConfig | None = None,
        grad_sync: Callable[[bool], contextlib.AbstractContextManager] | None = None,
        guard=None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.grad_clip = grad_clip
        self.guard = guard
        self.params = [p for p in model.parameters() if p.requires_grad]
        # DDP/FSDP: communicate gradients only on the last micro-step of an accumulation.
        self._grad_sync = grad_sync or (lambda is_last: contextlib.nullcontext())

        self._loss_fn = forward_loss
        self._update_fn = self._update
        scope = compile_cfg.scope if compile_cfg is not None and compile_cfg.enabled else None
        if scope in ("model+loss", "step"):
            self._loss_fn = compile_function(forward_loss, compile_cfg)
        if scope == "step":
            self._update_fn = compile_function(self._update, compile_cfg)

    def _grad_norm(self) -> Tensor:
        grads = [p.grad for p in self.params if p.grad is not None]
        if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6 has it; keeps the old path honest
            return torch.nn.utils.get_total_norm(grads, foreach=True)
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))

    def _update(self, loss: Tensor, want_grad_norm: bool) -> tuple[Tensor | None, Tensor | None]:
        norm = flag = None
        if self.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip, foreach=True)
        elif want_grad_norm or self.guard is not None:
            norm = self._grad_norm()
        if self.guard is not None:
            # Under a GradScaler an inf gradient is a routine overflow the scaler skips; only the
            # loss then says the run diverged.
            if self.guard.needs_flag:
                flag = self.guard.flag(loss, None if self.scaler is not None else norm)
            self.guard.step_optimizer(self.optimizer, flag, self.scaler)
        elif self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm, flag

    def __call__(self, micro_batches: list[tuple[Tensor, Tensor]], want_grad_norm: bool = False):
        n = len(micro_batches)
        total = None
        for i, (inputs, targets) in enumerate(micro_batches):
            with self._grad_sync(i == n - 1):
                loss = self._loss_fn(inputs, targets)
                scaled = loss / n if n > 1 else loss
                if self.scaler is not None:
                    scaled = self.scaler.scale(scaled)
                scaled.backward()
            detached = loss.detach()
            total = detached if total is None else total + detached
        mean = total / n if n > 1 else total
        if self.scaler is not None:
            # Clip the true gradients, not the scaled ones; unscale_ records inf/NaN on the device.
            self.scaler.unscale_(self.optimizer)
        norm, flag = self._update_fn(mean, want_grad_norm)
        self.scheduler.step()
        return mean, norm, flag


def evaluate(
    model: torch.nn.Module,
    eval_fn: Callable[[Tensor, Tensor], tuple[Tensor, Tensor | None]],
    batches,
    steps: int,
    *,
    device: torch.device,
) -> dict[str, float]:
    """Mean loss (and accuracy where it applies) over up to `steps` eval batches; one host read."""
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    has_accuracy = False
    batches_done = items = 0
    with torch.no_grad():
        for inputs, targets in batches:
            if batches_done == steps:
                break
            loss, hits = eval_fn(inputs, targets)
            loss_sum += loss.float()
            if hits is not None:
                has_accuracy = True
                correct += hits
            items += targets.numel()
            batches_done += 1
    model.train(was_training)
    # Each rank evaluated its own shard: sum the parts (one collective; a no-op in one process).
    totals = torch.stack([loss_sum, correct.to(loss_sum.dtype),
                          torch.tensor(float(batches_done), device=device), torch.tensor(float(items), device=device)])
    totals = all_reduce_sum(totals).tolist()
    if totals[2] == 0:
        return {}
    result = {"eval_loss": totals[0] / totals[2]}
    if has_accuracy:
        result["eval_accuracy"] = totals[1] / max(totals[3], 1)
    return result
