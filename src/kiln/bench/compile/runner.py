"""One benchmarked recipe, built the way `kiln train` builds it, and started: first step (which
compiles), warm-up, the values the accuracy check needs and the memory it took.

Every runner of a bench starts from the same initial weights (the config's seed), the same
batches (fixed, already on the device, so the input pipeline is not measured) and the same RNG
state at its first step, so the runs differ only by the recipe.
"""

from __future__ import annotations

import copy
import gc
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from kiln.bench.ceilings import matmul_dtype, measure_best_matmul, spec_figures
from kiln.bench.compile.distill import build_teacher, logits_of, loss_builder
from kiln.bench.compile.plain import PlainLoop
from kiln.bench.compile.recipe_accuracy import uses_rng
from kiln.bench.compile.recipes import Recipe, recipe_config
from kiln.compile import apply_compile, compile_counters
from kiln.config.schema import Config
from kiln.data import build_data
from kiln.models import build_model
from kiln.monitor.flops import count_step_flops
from kiln.monitor.memory import reset_peak
from kiln.precision import PrecisionPolicy, apply_precision, resolve_precision, with_precision
from kiln.runtime import seed_everything
from kiln.timing import synchronize, time_calls, time_each
from kiln.train.assemble import build_train_step

# The accuracy reference: eager, weights and floating inputs in float64, no autocast.
FP64 = PrecisionPolicy("fp64", None, torch.float64, False)


@dataclass
class BenchContext:
    """What all rows of one bench share: base config, device, batches, the teacher."""

    cfg: Config
    device: torch.device
    train: bool
    task: str = ""
    model_name: str = ""
    batches: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    samples_per_step: int = 0
    tokens_per_step: int | None = None
    flops_per_step: int | None = None
    """Model FLOPs of one timed unit (counted once, on the first eager runner)."""
    _teachers: dict[torch.dtype, nn.Module] = field(default_factory=dict)
    _peaks: dict[str, float] = field(default_factory=dict)

    def matmul_peak(self, precision: str) -> float:
        """The device's best matmul FLOP/s at this precision's matrix-unit dtype (the best of
        several sizes, kiln.bench.ceilings), measured once here."""
        dtype = matmul_dtype(precision, self.cfg.precision.tf32)
        key = str(dtype)
        if key not in self._peaks:
            self._peaks[key] = measure_best_matmul(self.device, dtype)[0]
        return self._peaks[key]

    def spec_peak(self, precision: str) -> tuple[float | None, str | None]:
        """(the datasheet's dense FLOP/s at this precision's matrix-unit dtype, its source), or
        (None, None) off CUDA or for a GPU kiln.bench.gpu_specs does not list."""
        figures = spec_figures(self.device, matmul_dtype(precision, self.cfg.precision.tf32), self.cfg.precision.tf32)
        if figures.get("spec_flops_per_s") is None:
            return None, None
        return figures["spec_flops_per_s"], f"{figures['spec_name']}: {figures['spec_source']}"

    @property
    def accum(self) -> int:
        return self.cfg.training.grad_accum_steps if self.train else 1

    @property
    def rng_seed(self) -> int:
        return self.cfg.training.seed + 2

    def teacher(self, dtype: torch.dtype) -> nn.Module:
        """The frozen distillation teacher in the parameter dtype of a policy (built once)."""
        if torch.float32 not in self._teachers:
            self._teachers[torch.float32] = build_teacher(self.cfg.model, self.device, self.cfg.training.seed + 1)
        if dtype not in self._teachers:
            self._teachers[dtype] = copy.deepcopy(self._teachers[torch.float32]).to(dtype=dtype)
        return self._teachers[dtype]

    def drop_teacher(self, dtype: torch.dtype) -> None:
        if dtype != torch.float32:
            self._teachers.pop(dtype, None)

    def close(self) -> None:
        self._teachers.clear()
        self.batches.clear()


def _spec_complete(built) -> bool:
    """Whether a model built on meta told the data everything it needs: its input spec and, for
    its task, the number of classes or the vocabulary."""
    spec = built.input_spec
    return spec is not None and (spec.num_classes is not None or spec.vocab_size is not None)


def build_context(cfg: Config, device: torch.device, *, train: bool, batches: int) -> BenchContext:
    """Build the data once (from a model built on the meta device for its input shape)."""
    try:
        with torch.device("meta"):
            built = build_model(cfg.model)
    except Exception:  # a user factory that cannot build on meta: build it for real, once
        built = None
    if built is None or not _spec_complete(built):
        # A user model whose forward reads values tells its classes or vocabulary only for real.
        built = build_model(cfg.model)
    ctx = BenchContext(cfg=cfg, device=device, train=train, task=built.task, model_name=cfg.model.name)
    source = build_data(cfg.data, built.input_spec, device=device, seed=cfg.training.seed)
    stream = iter(source)
    # Clones: the batches must not keep the source's (possibly large) synthetic pool alive.
    ctx.batches = [tuple(t.clone() for t in next(stream)) for _ in range(batches * ctx.accum)]
    ctx.samples_per_step = source.samples_per_batch * ctx.accum
    ctx.tokens_per_step = source.tokens_per_batch * ctx.accum if source.tokens_per_batch else None
    del stream, source, built
    return ctx


class Runner:
    """A built recipe: `runner()` is one timed unit (an optimizer step, or a forward pass)."""

    def __init__(self, ctx: BenchContext, recipe: Recipe, policy: PrecisionPolicy | None = None):
        self.ctx, self.recipe = ctx, recipe
        device = ctx.device
        cfg = recipe_config(ctx.cfg, recipe)
        self.policy = policy or resolve_precision(recipe.precision, device)
        seed_everything(cfg.training.seed)
        built = build_model(cfg.model)
        self.model = apply_precision(built.module.to(device), self.policy)
        self._cursor = 0
        self.last: Any = None
        self._plain: PlainLoop | None = None
        if ctx.train and recipe.runner == "plain":
            self.model.train()
            self._plain = PlainLoop(self.model, built.task, cfg, self.policy, device, ctx.batches, ctx.accum)
        elif ctx.train:
            self.model.train()
            teacher = ctx.teacher(self.policy.param_dtype) if recipe.loss == "distill" else None
            build_loss = loss_builder(recipe.loss, recipe.scope, built.task, teacher, cfg.compile)
            self._step = build_train_step(self.model, built.task, built.blocks, cfg, self.policy, device,
                                          loss_builder=build_loss)
        else:
            self.model.eval()
            apply_compile(self.model, cfg.compile, built.blocks)
            model = self.model
            self._forward = with_precision(lambda inputs, targets: logits_of(model(inputs)), self.policy, device)

    def _next(self, n: int) -> list[tuple[Tensor, Tensor]]:
        batches = self.ctx.batches
        out = [batches[(self._cursor + i) % len(batches)] for i in range(n)]
        self._cursor = (self._cursor + n) % len(batches)
        return out

    @property
    def capture_status(self) -> str | None:
        """Whole-step capture's status for a training recipe that asked for it, else None."""
        return getattr(getattr(self, "_step", None), "capture_status", None)

    def __call__(self) -> None:
        if self._plain is not None:
            self._plain()
            self.last = self._plain.last
        elif self.ctx.train:
            # TrainStep returns (mean loss, grad norm, ...): the loss comes first.
            self.last = self._step(self._next(self.ctx.accum))[0]
        else:
            with torch.no_grad():
                self.last = self._forward(*self._next(1)[0])

    def count_flops(self) -> int:
        """Model FLOPs of one timed unit on the eager path (kiln.monitor.flops): forward, loss and
        backward of each micro-batch for training, the forward for inference."""
        x, y = self.ctx.batches[0]
        if not self.ctx.train:
            with torch.no_grad():
                return count_step_flops(lambda: self._forward(x, y), device=self.ctx.device, module=self.model)
        loss_fn = self._step._loss_fn  # the eager runner: not compiled
        try:
            flops = count_step_flops(lambda: loss_fn(x, y).backward(), device=self.ctx.device, module=self.model)
        finally:
            self.model.zero_grad(set_to_none=True)
        return flops * self.ctx.accum

    def read(self) -> float | Tensor:
        """The last result, copied to the host now (CUDA-graph outputs are overwritten by the next replay)."""
        if self.ctx.train:
            return float(self.last)
        return self.last.detach().to("cpu", copy=True)


@dataclass
class Started:
    runner: Runner
    first_step_s: float
    warmup_s: float
    values: list[Any]
    """Loss per step from the first (training) or the first output (inference), on the host."""
    peak_mem_bytes: int | None
    counters: dict[str, int]
    uses_rng: bool = False


def allocated(device: torch.device) -> int:
    return int(torch.cuda.memory_allocated(device)) if device.type == "cuda" else 0


def start_runner(ctx: BenchContext, recipe: Recipe, *, warmup: int, values: int, probe_rng: bool = False,
                 policy: PrecisionPolicy | None = None) -> Started:
    """Build, take the first step (timed: it compiles), then `warmup` steps, reading the first
    `values` results. Peak memory is over the warm-up steps, net of what was allocated before."""
    device = ctx.device
    gc.collect()  # what the previous row left in reference cycles must not count in (or out of) this one
    base = allocated(device)
    before = compile_counters()
    runner = Runner(ctx, recipe, policy)
    torch.manual_seed(ctx.rng_seed)  # same dropout masks for every eager run (and fallback_random)
    used = False

    def first() -> None:
        nonlocal used
        if probe_rng:
            _, used = uses_rng(runner, device)
        else:
            runner()

    first_s = time_calls(first, calls=1, device=device)
    got = [runner.read()]
    reset_peak(device)

    def keep(_: int) -> None:
        if len(got) < values:
            got.append(runner.read())

    warm_s = sum(time_each(runner, max(warmup, values - 1), device=device, after=keep)[:warmup])
    peak = int(torch.cuda.max_memory_allocated(device)) - base if device.type == "cuda" else None
    if peak is not None and peak < 0:
        # Memory counted in `base` was freed while this row started, so the difference says nothing
        # about this row (it happens to reduce-overhead rows timed right after a row with
        # whole-step capture). Reported as not measured rather than negative.
        peak = None
    after = compile_counters()
    counters = {k: after[k] - before.get(k, 0) for k in after}
    return Started(runner, first_s, warm_s, got[:max(values, 1)], peak, counters, used)


def release(device: torch.device) -> None:
    """Free what the last row left: Python garbage, the CUDA cache, dynamo's compiled code."""
    import torch._dynamo

    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        # Recent torch resets CUDA-graph trees in dynamo.reset(); older releases need it done here.
        from torch._inductor import cudagraph_trees

        cudagraph_trees.reset_cudagraph_trees()
        synchronize(device)
        torch.cuda.empty_cache()
