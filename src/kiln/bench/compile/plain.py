"""The training loop a user writes by hand: the baseline kiln's own step must beat.

    model = torch.compile(model, mode=...)            # the whole model, the documented way
    opt = torch.optim.AdamW(model.parameters(), lr, fused=on CUDA)
    for x, y in batches:
        with torch.autocast(...):                     # bf16/fp16 policies
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()                 # fp16: GradScaler
        scaler.unscale_(opt); clip_grad_norm_(...)    # when training.grad_clip > 0
        scaler.step(opt); scaler.update(); opt.zero_grad(set_to_none=True); sched.step()

Same settings as kiln's step (optimizer hyper-parameters, clipping, LR schedule, precision), no
non-finite guard, no weight-decay groups, nothing compiled but the model. `kiln bench compile
--baseline plain` times it beside kiln's recipes; benchmarks/trainer_overhead.py compares it with
a whole `kiln train` run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from kiln.compile import compile_kwargs
from kiln.config.schema import Config
from kiln.precision import PrecisionPolicy, autocast, make_grad_scaler
from kiln.train.losses import build_forward_loss
from kiln.train.optim import build_scheduler, schedule_steps


def plain_step(model: torch.nn.Module, task: str, cfg: Config, policy: PrecisionPolicy,
               device: torch.device) -> Callable[[Sequence[tuple[Tensor, Tensor]]], Tensor]:
    """`step(micro_batches) -> loss` for an already built, cast model: one optimizer step over the
    micro-batches (gradient accumulation the plain way); compiles the model if
    `cfg.compile.enabled` (mode/backend only: scopes, regional and whole-step capture are kiln's)."""
    if cfg.compile.enabled:
        plain = {**compile_kwargs(cfg.compile), "dynamic": None, "fullgraph": False}
        model = torch.compile(model, **plain)
    o = cfg.optim
    fused = device.type == "cuda" and o.fused is not False
    if o.name == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                                weight_decay=o.weight_decay, fused=fused)
    sched = build_scheduler(opt, o, schedule_steps(cfg))
    scaler = make_grad_scaler(policy, device)
    loss_of = build_forward_loss(model, task)
    clip = cfg.training.grad_clip
    cast = policy.param_dtype != torch.float32

    def step(micro_batches: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
        n = len(micro_batches)
        total = None
        for x, y in micro_batches:
            if cast and x.is_floating_point():
                x = x.to(policy.param_dtype)
            with autocast(policy, device):
                loss = loss_of(x, y) / n
            (scaler.scale(loss) if scaler is not None else loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        if scaler is not None:
            scaler.unscale_(opt)
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        return total

    return step


class PlainLoop:
    """A bench runner over the hand-written step: each call is one optimizer step over the next
    `accum` batches."""

    def __init__(self, model: torch.nn.Module, task: str, cfg: Config, policy: PrecisionPolicy,
                 device: torch.device, batches: Sequence[tuple[Tensor, Tensor]], accum: int = 1) -> None:
        self.model = model
        self._step = plain_step(model, task, cfg, policy, device)
        self._batches = batches
        self._accum = accum
        self._cursor = 0
        self.last: Tensor | None = None

    def __call__(self) -> None:
        n = len(self._batches)
        micro = [self._batches[(self._cursor + i) % n] for i in range(self._accum)]
        self._cursor = (self._cursor + self._accum) % n
        self.last = self._step(micro)

    def read(self) -> float:
        # Read before the next call: under reduce-overhead the loss lives in a CUDA graph's output.
        return float(self.last)
