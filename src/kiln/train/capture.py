"""Whole-step capture: one optimizer step replays as one CUDA graph (`compile.cudagraphs=true`).

A small-batch training step is launch-bound: torch.compile's reduce-overhead graphs only the
forward and backward, while clipping, the non-finite guard, the optimizer and the LR schedule
still launch kernels one by one from Python. Here the whole step is captured, as in PyTorch's
"whole network capture" (CUDA Graphs notes, torch.cuda.graph):

- static input buffers: each step copies its batch into them, then replays the graph;
- a capturable optimizer: step counts and the LR live on the device (train.optim, purpose
  `captured`), and the LR schedule advances on the device (`DeviceSchedule`);
- the non-finite guard counts on the device, with the step number from a device counter;
- autocast without its cast cache, GradScaler only with a fused optimizer (its `step` would
  otherwise read found-inf on the host);
- warm-up steps (real training steps) on a side stream first, so compilation, lazy optimizer
  state and cuBLAS workspaces exist before capture; compile modes that record CUDA graphs
  themselves are compiled without them (kiln.compile.compile_kwargs).

Gradients are set to None before capture, so the captured backward assigns them (no zeroing
kernel) and the replays overwrite them. What cannot be captured falls back to the normal step
with the reason logged and reported (`capture_status`): no CUDA device, several processes
(DDP/FSDP communicate from hooks kiln does not capture), a batch of another shape (that step
only), or a failed capture (a host sync such as `.item()` or `print(tensor)` in the step).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from kiln.timing import side_stream
from kiln.train.optim import DeviceSchedule
from kiln.train.step import TrainStep

log = logging.getLogger("kiln.train")

WARMUP_STEPS = 3
"""Steps run on a side stream before capture (PyTorch's example uses 3; DDP would need 11)."""


class CudaGraph:
    """torch.cuda.CUDAGraph behind the two calls CapturedStep makes (tests swap in an emulation)."""

    def __init__(self) -> None:
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, body: Callable[[], None]) -> None:
        with torch.cuda.graph(self.graph):
            body()

    def replay(self) -> None:
        self.graph.replay()


def capture_problem(device: torch.device, strategy: str) -> str | None:
    """Why whole-step capture cannot run here, known before any step; None when it can."""
    if device.type != "cuda":
        return f"needs a CUDA device, this run is on {device.type}"
    if strategy != "none":
        return (f"captures one process only ({strategy} communicates gradients from hooks outside the graph); "
                "use compile.mode=reduce-overhead for multi-GPU runs")
    return None


def scaler_problem(optimizer: torch.optim.Optimizer, scaler) -> str | None:
    """GradScaler.step reads found-inf on the host unless the optimizer takes it as a tensor."""
    if scaler is not None and not getattr(optimizer, "_step_supports_amp_scaling", False):
        return ("fp16-mixed needs a fused optimizer to be captured (GradScaler.step reads found-inf on the host "
                "otherwise): keep optim.fused=auto and compile.scope other than step")
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:240]


class CapturedStep:
    """A TrainStep whose steps replay one CUDA graph; same call signature and attributes.

    `reason` (not None) means capture was ruled out up front: every step runs `step` as is."""

    observes_guard = True

    def __init__(self, step: TrainStep, schedule: DeviceSchedule, *, reason: str | None = None,
                 warmup: int = WARMUP_STEPS, graph_factory: Callable[[], Any] | None = None) -> None:
        self.step = step
        self.model, self.optimizer, self.scheduler, self.scaler = step.model, step.optimizer, step.scheduler, step.scaler
        self.schedule = schedule
        self.guard = step.guard
        self.warmup = warmup
        self.graph_factory = graph_factory
        self.fallback_reason = reason
        self.capture_s: float | None = None
        self._graph: Any = None
        self._calls = 0
        self._static: list[tuple[Tensor, Tensor]] = []
        self._out: dict[str, Tensor] = {}
        self._step_no: Tensor | None = None  # 1-based number of the step being run, on the device
        self._other_shapes = 0
        if reason is None and self.guard is not None:
            self.guard.use_counters()
        if reason is not None:
            self.observes_guard = False
            log.warning("compile.cudagraphs: whole-step capture is off (%s); running the normal step", reason)

    @property
    def capture_status(self) -> str:
        if self.fallback_reason is not None:
            return f"fallback: {self.fallback_reason}"
        if self._graph is None:
            return "warming up"
        return "captured" + (f" ({self._other_shapes} step(s) of another batch shape ran uncaptured)"
                             if self._other_shapes else "")

    # -- the captured body -------------------------------------------------------------------
    def _body(self) -> None:
        """One whole step on the static buffers; device work only (capturable)."""
        loss, norm, flag = self.step.run(self._static, want_grad_norm=True)
        if self.guard is not None:
            scaled = self.scaler is not None  # under a GradScaler an inf gradient is a routine overflow
            flag = self.guard.observe(loss, None if scaled else norm, self._step_no, flag=flag)
        self.schedule.advance()
        self._step_no.add_(1)
        self._out["loss"].copy_(loss)
        if norm is not None:
            self._out["norm"].copy_(norm)
        if flag is not None:
            self._out["flag"].copy_(flag)

    def _outputs(self) -> tuple[Tensor, Tensor | None, Tensor | None]:
        return self._out["loss"], self._out.get("norm"), self._out.get("flag")

    def _load(self, micro_batches: list[tuple[Tensor, Tensor]]) -> bool:
        """Copy the batch into the static buffers; False if its shapes or dtypes differ."""
        if len(micro_batches) != len(self._static):
            return False
        for (x, y), (sx, sy) in zip(micro_batches, self._static):
            if x.shape != sx.shape or y.shape != sy.shape or x.dtype != sx.dtype or y.dtype != sy.dtype:
                return False
        for (x, y), (sx, sy) in zip(micro_batches, self._static):
            sx.copy_(x, non_blocking=True)
            sy.copy_(y, non_blocking=True)
        return True

    def _first_call(self, micro_batches: list[tuple[Tensor, Tensor]]) -> None:
        device = micro_batches[0][0].device
        self._static = [(x.clone(), y.clone()) for x, y in micro_batches]
        self._step_no = torch.full((), self.scheduler.last_epoch + 1, dtype=torch.int64, device=device)
        self.schedule.sync_from_host()
        self.optimizer.zero_grad(set_to_none=True)
        kw = {"device": device}
        self._out = {"loss": torch.zeros((), **kw)}
        self._out["norm"] = torch.zeros((), **kw)
        if self.guard is not None and self.guard.needs_flag:
            self._out["flag"] = torch.zeros((), dtype=torch.bool, **kw)

    def _unshaped(self, micro_batches, want_grad_norm: bool):
        """A step that cannot replay (another batch shape): the normal step, in step with the graph's
        counters (its guard observation and LR schedule are the device ones)."""
        self._other_shapes += 1
        if self._other_shapes == 1:
            log.warning("compile.cudagraphs: a batch of another shape ran without the captured graph "
                        "(set data.drop_last=true to keep every batch the same shape)")
        loss, norm, flag = self.step.run(micro_batches, want_grad_norm=True)
        if self.guard is not None:
            flag = self.guard.observe(loss, None if self.scaler is not None else norm, self._step_no, flag=flag)
        self.schedule.advance()
        self._step_no.add_(1)
        self.schedule.host_step()
        return loss, norm, flag

    def __call__(self, micro_batches: list[tuple[Tensor, Tensor]], want_grad_norm: bool = False):
        if self.fallback_reason is not None:
            return self._fallback(micro_batches, want_grad_norm)
        if self._calls == 0:
            self._first_call(micro_batches)
        self._calls += 1
        if not self._load(micro_batches):
            return self._unshaped(micro_batches, want_grad_norm)
        if self._graph is None and self._calls <= self.warmup:
            with side_stream(self._static[0][0].device):
                self._body()
            self.schedule.host_step()
            return self._outputs()
        if self._graph is None:
            self._capture()
            if self.fallback_reason is not None:
                return self._fallback(micro_batches, want_grad_norm)
        self._graph.replay()
        self.schedule.host_step()
        return self._outputs()

    def _capture(self) -> None:
        import time

        graph = (self.graph_factory or CudaGraph)()
        started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        try:
            graph.capture(self._body)
        except Exception as exc:  # e.g. a host sync in the model: cudaErrorStreamCaptureUnsupported
            self.fallback_reason = f"capture failed ({_first_line(exc)}); a host sync (.item(), .cpu(), print of a " \
                                   "tensor, data-dependent Python control flow) in the step cannot be captured"
            log.warning("compile.cudagraphs: %s; running the normal step from here on", self.fallback_reason)
            self.optimizer.zero_grad(set_to_none=True)  # grads the failed capture allocated are garbage
            states = getattr(self.scaler, "_per_optimizer_states", None)
            if states is not None:
                states.clear()  # the half-run capture may have left this step's unscale_ recorded
            self.observes_guard = False  # the guard keeps its counters; the trainer records each step
            return
        self.capture_s = time.perf_counter() - started
        self._graph = graph
        log.info("compile.cudagraphs: whole step captured in %.2fs after %d warm-up steps", self.capture_s, self.warmup)

    def _fallback(self, micro_batches, want_grad_norm: bool):
        """The normal step. After a failed capture LambdaLR takes over the LR from its step count,
        which `host_step` kept equal to the device schedule's."""
        return self.step(micro_batches, want_grad_norm)
