"""Calling a target the same way in every stage: quiet stdout, a loss for --train, a process group
for models that call torch.distributed in forward."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves

_NO_PG_MARKERS = ("process group has not been initialized", "Default process group has not been initialized")


@contextlib.contextmanager
def quiet_stdout(sink: list[str] | None = None) -> Iterator[None]:
    """Models that print in forward (the seed's four-break model does) would flood the report."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        if sink is not None and buffer.getvalue():
            sink.append(buffer.getvalue())


class _DropCompilerChatter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith(("torch._dynamo", "torch._inductor")) and record.levelno <= logging.WARNING)


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Hide torch.compile's own warnings about breaks and recompiles while we diagnose them (the report
    says the same, with the place and the fix); errors still show. Filters are removed on exit."""
    handlers = {h for name in ("torch", "torch._dynamo", "torch._inductor") for h in logging.getLogger(name).handlers}
    drop = _DropCompilerChatter()
    for h in handlers:
        h.addFilter(drop)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        for h in handlers:
            h.removeFilter(drop)


class NothingToBackprop(RuntimeError):
    """The outputs need no grad: a training-mode module kiln runs forward-only, with autograd on."""


def loss_of(output: Any) -> torch.Tensor:
    """`--train` backpropagates the sum of every floating-point output that needs grad."""
    parts = [t.float().sum() for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not parts:
        raise NothingToBackprop("--train: the model's outputs do not require grad (nothing to backpropagate)")
    return torch.stack(parts).sum()


def call(fn: Callable, inputs: tuple[Any, ...], train: bool, module: nn.Module | None = None,
         grad: bool | None = None):
    """Run forward (and backward with `train`); returns (outputs, {param name: grad}). Autograd is on
    with `train`, or when `grad` says so (a training-mode module run forward-only)."""
    if module is not None:
        module.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(train if grad is None else grad):
        out = fn(*inputs)
        grads: dict[str, torch.Tensor] = {}
        if train:
            loss_of(out).backward()
            if module is not None:
                grads = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}
    return out, grads


@dataclass(frozen=True)
class RunMode:
    """How the target is called: backward too (`train`), autograd on in forward (`grad`), and why."""

    train: bool
    grad: bool
    why: str


def run_mode(module: nn.Module, train: bool | None) -> RunMode:
    """`--train` / `--no-train` as given; else as the user runs the module: a module in training mode
    (nn.Module's default) runs forward and backward, one in eval mode forward with autograd off."""
    if train is not None:
        return RunMode(train, train, "--train: forward and backward" if train else "--no-train: forward only, autograd off")
    if module.training:
        return RunMode(True, True, "the module is in training mode: forward and backward, as a training step runs it")
    return RunMode(False, False, "the module is in eval mode: forward only, autograd off, as inference runs it")


FORWARD_WITH_GRAD = RunMode(False, True, "the module is in training mode but its outputs need no grad: forward "
                                         "with autograd on, no backward")


class EagerFailure(RuntimeError):
    """The target fails without torch.compile: not a compile problem; fix that first (exit 1)."""


def eager_check(module: nn.Module, inputs: tuple[Any, ...], train: bool, printed: list[str],
                grad: bool | None = None) -> bool:
    """Run once without compile; True when it failed only for want of a process group."""
    try:
        with quiet_stdout(printed):
            call(module, inputs, train, grad=grad)
        return False
    except NothingToBackprop:
        raise
    except Exception as exc:
        if not needs_process_group(exc):
            raise EagerFailure(f"the model fails without torch.compile: {first_line(exc)}") from exc
    return True


def needs_process_group(exc: BaseException) -> bool:
    text = str(exc)
    return any(marker in text for marker in _NO_PG_MARKERS)


@contextlib.contextmanager
def single_process_group(enabled: bool) -> Iterator[bool]:
    """A 1-process gloo group on an in-memory store (no ports, no env vars), destroyed on exit.

    The seed's all_reduce model needs a process group to run at all; with world_size 1 the
    collective is an identity, so eager results stay meaningful while torch still has to trace it.
    """
    import torch.distributed as dist

    if not enabled or not dist.is_available() or dist.is_initialized():
        yield False
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield True
    finally:
        dist.destroy_process_group()


def first_line(exc: BaseException, limit: int = 400) -> str:
    """`Type: first meaningful line` of an exception, for tables and JSON."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    head = lines[0] if lines else ""
    if head.endswith(":") and len(lines) > 1:
        head += " " + lines[1]  # torch.compile wraps errors as "backend='x' raised:\nTheError: ..."
    text = f"{type(exc).__name__}: {head}".rstrip(": ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
