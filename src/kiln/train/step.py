"""The training step: forward (+loss) -> backward -> (unscale) -> clip -> optimizer -> scheduler.

Nothing here reads a device value on the host: the loss and gradient norm come back as device
tensors, and the trainer reads them at log intervals only, so the CPU can run ahead of the GPU.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable

import torch
from torch import Tensor

from kiln.compile import compile_function
from kiln.config.schema import CompileConfig
from kiln.distributed.sharded_norm import clip_grad_norm, total_norm
from kiln.distributed.world import all_reduce_sum


def uses_cudagraph_trees(cfg: CompileConfig | None) -> bool:
    """Whether torch.compile records its own CUDA graphs (cudagraph trees) for this config."""
    if cfg is None or not cfg.enabled or cfg.backend != "inductor":
        return cfg is not None and cfg.enabled and cfg.backend == "cudagraphs"
    if cfg.options:
        return bool(cfg.options.get("triton.cudagraphs"))
    import torch._inductor

    return bool(torch._inductor.list_mode_options().get(cfg.mode or "default", {}).get("triton.cudagraphs"))


class TrainStep:
    """One optimizer step over `grad_accum_steps` micro-batches.

    Call with a list of `(inputs, targets)` micro-batches; returns `(mean_loss, grad_norm, flag)`
    as device tensors: `grad_norm` is None when neither clipping, the non-finite guard nor the
    caller needs it; `flag` (a device bool: loss or gradient norm not finite) is None without a
    guard. With a guard in `skip` mode a non-finite update is dropped on the device.

    Under a compile mode that records CUDA graphs (reduce-overhead, max-autotune) each step begins
    with `torch.compiler.cudagraph_mark_step_begin()` and the values handed back are copies: a
    graph's outputs are overwritten by its next replay (PyTorch "CUDAGraph Trees" docs).
    """

    observes_guard = False
    """The caller records each step with the guard (a captured step does it inside its graph)."""

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
        self._folds_clip = hasattr(optimizer, "clip_coef")
        # DDP/FSDP: communicate gradients only on the last micro-step of an accumulation.
        self._grad_sync = grad_sync or (lambda is_last: contextlib.nullcontext())

        self._loss_fn = forward_loss
        scope = compile_cfg.scope if compile_cfg is not None and compile_cfg.enabled else None
        self._trees = uses_cudagraph_trees(compile_cfg) and not compile_cfg.cudagraphs
        if scope in ("model+loss", "step"):
            self._loss_fn = compile_function(forward_loss, compile_cfg)
        # Scope `step` compiles the update as one graph: norm/clip, guard flag and the optimizer's
        # own step function, traced whole. Two things keep it whole: the optimizer is called
        # through its undecorated step (torch's `_use_grad` wrapper inserts graph breaks on purpose,
        # pytorch#104053, and LR schedulers wrap `step` in a function dynamo skips), under
        # no_grad set by the caller; and zero_grad stays outside (dynamo skips it). A GradScaler or
        # the `skip` policy decide on the host whether to apply an update, so with them only the
        # norm and flag are compiled and the update runs eagerly.
        self._update_in_graph = scope == "step" and scaler is None and not (guard is not None and guard.needs_flag)
        self._norm_compiled = scope == "step"
        self._norm_fn = self._norm_and_flag
        self._update_fn = self._graph_update
        if scope == "step":
            self._norm_fn = compile_function(self._norm_and_flag, compile_cfg)
            self._update_fn = compile_function(self._graph_update, compile_cfg)
            optimizer._opt_called = True  # what the scheduler's wrapper would record (we bypass it)

    def _norm_and_flag(self, loss: Tensor, want_grad_norm: bool) -> tuple[Tensor | None, Tensor | None]:
        # FSDP2's sharded gradients take the local-shard path (one all-reduce, no DTensor dispatch).
        norm = flag = None
        if self.grad_clip > 0 and self._folds_clip:
            # The optimizer scales the gradients inside its update (kiln.train.master_adamw): the
            # coefficient torch's clip_grad_norm_ would multiply them by, left on the device.
            norm = total_norm([p.grad for p in self.params if p.grad is not None], fp32=True)
            self.optimizer.clip_coef = (self.grad_clip / (norm + 1e-6)).clamp(max=1.0)
        elif self.grad_clip > 0:
            norm = clip_grad_norm(self.params, self.grad_clip)
        elif want_grad_norm or self.guard is not None:
            norm = total_norm([p.grad for p in self.params if p.grad is not None])
        if self.guard is not None and self.guard.needs_flag:
            # Under a GradScaler an inf gradient is a routine overflow the scaler skips; only the
            # loss then says the run diverged.
            flag = self.guard.flag(loss, None if self.scaler is not None else norm)
        return norm, flag

    def _apply(self, flag: Tensor | None) -> None:
        if self.guard is not None:
            self.guard.step_optimizer(self.optimizer, flag, self.scaler)
        elif self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()

    def _graph_update(self, loss: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """Norm, clip and the optimizer update in one traceable function (scope `step`)."""
        norm, flag = self._norm_and_flag(loss, True)
        inspect.unwrap(type(self.optimizer).step)(self.optimizer)
        return norm, flag

    def _update(self, loss: Tensor, want_grad_norm: bool) -> tuple[Tensor | None, Tensor | None]:
        if self._update_in_graph:
            with torch.no_grad():  # entered outside the graph, so AOT sees an inference graph
                norm, flag = self._update_fn(loss)
        else:
            # A compiled norm always computes the norm: a flag argument that flips at log steps
            # would recompile it.
            norm, flag = self._norm_fn(loss, want_grad_norm or self._norm_compiled)
            self._apply(flag)
            if self._folds_clip:
                self.optimizer.clip_coef = None  # a skipped update must not leave it for the next
        self.optimizer.zero_grad(set_to_none=True)
        return norm, flag

    def run(self, micro_batches: list[tuple[Tensor, Tensor]], want_grad_norm: bool = False):
        """Everything of a step but the LR schedule: forward, loss, backward, clip, guard, update."""
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
            if self._trees:
                detached = detached.clone()
            total = detached if total is None else total + detached
        mean = total / n if n > 1 else total
        if self.scaler is not None:
            # Clip the true gradients, not the scaled ones; unscale_ records inf/NaN on the device.
            self.scaler.unscale_(self.optimizer)
        norm, flag = self._update(mean, want_grad_norm)
        if self._trees:
            norm = norm.clone() if norm is not None else None
            flag = flag.clone() if flag is not None else None
        return mean, norm, flag

    def __call__(self, micro_batches: list[tuple[Tensor, Tensor]], want_grad_norm: bool = False):
        if self._trees:
            torch.compiler.cudagraph_mark_step_begin()
        mean, norm, flag = self.run(micro_batches, want_grad_norm)
        self.scheduler.step()
        return mean, norm, flag


def evaluate(
    model: torch.nn.Module,
    eval_fn: Callable[[Tensor, Tensor], tuple[Tensor, Tensor | None]],
    batches,
    steps: int,
    *,
    device: torch.device,
    perplexity: bool = False,
) -> dict[str, float]:
    """Mean loss (and accuracy where it applies) over up to `steps` eval batches; one host read.
    With `perplexity` (language models: the loss is a mean next-token cross-entropy in nats, every
    batch the same number of tokens) also `eval_perplexity` = exp(eval_loss)."""
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
    if perplexity:
        loss = result["eval_loss"]
        result["eval_perplexity"] = math.exp(loss) if loss < 700 else math.inf  # exp overflows past ~709
    if has_accuracy:
        result["eval_accuracy"] = totals[1] / max(totals[3], 1)
    return result
