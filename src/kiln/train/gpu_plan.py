"""The GPU memory plan of a run, before any rank allocates its model, and the refusal (exit 2) of a run
that cannot fit, naming the settings that would make it fit, cheapest first.

The model is built on the meta device (no memory, no compute); its shape (parameters per FSDP2
unit, matmul weights, vocabulary) and one micro-batch's saved activations under each checkpointing
mode go into the arithmetic of kiln.train.gpu_memory. For kiln's decoder the activations are
counted from its shapes (kiln.train.activation_bytes, for the SwiGLU and attention kernels the run
uses); other models' are measured on the meta device (kiln.train.memory_plan.saved_activations, in
the compute dtype). The device's free memory is `torch.cuda.mem_get_info` on the rank, or, on
the launcher's side, NVML's total (kiln.train.preflight), so a config that cannot fit is refused in
seconds. The plan is printed at the start (rank 0), kept in summary.json under `memory_plan`, and
the measured peak (torch.cuda.max_memory_allocated / reserved, the max over ranks) is recorded
beside it at the end: the allocated peak against the plan's, the reserved one against the plan's
reserved figure (allocated + the allocator's slack), which is also what a run is refused on.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from kiln.config.schema import Config
from kiln.data.base import resolve_seq_len
from kiln.distributed.fsdp import fsdp_units, reshards_after_forward
from kiln.errors import ConfigError
from kiln.llm.model import Attention, Block, Decoder, FeedForward, RMSNorm
from kiln.models.host_memory import optimizer_slots
from kiln.models.spec import BuiltModel
from kiln.monitor.nvml import import_nvml
from kiln.precision import PrecisionPolicy
from kiln.train import activation_bytes as ab
from kiln.train.activation_checkpoint import without_plan
from kiln.train.cross_entropy import CHUNK_LOGIT_BYTES, chunk_tokens, resolve_ce_kernel
from kiln.train.gpu_memory import (
    HEADROOM,
    GpuPlan,
    ModelShape,
    Setup,
    StepMemory,
    fits,
    gib,
    logits_bytes,
    plan_gpu,
    table,
)
from kiln.train.memory_plan import SKIP_ENV, Activations, meta_model, own_model, saved_activations
from kiln.train.swiglu import resolve_swiglu_kernel

log = logging.getLogger("kiln.train")

_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
AC_ORDER = ("none", "selective", "full")
# The most ranks the refusal looks for when naming how many would fit.
MAX_RANKS = 1024
KEEP_SHARE = 0.75
"""`distributed.fsdp_reshard_after_forward=auto`: a model the size rule would reshard
(kiln.distributed.fsdp.KEEP_GATHERED_BYTES) keeps its FSDP2 units gathered from forward to backward
when the plan with them kept reserves at most this share of the device: one all-gather less per
unit and step, measured faster at the 1B and 8B shapes on four GPUs (the h200x4 results), for the
gathered parameters' memory; the rest of the device is room for what the plan does not count."""


def _width(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits // 8


@dataclass(frozen=True)
class Measured:
    """What the plan knows of the model and one micro-batch, measured once on the meta device."""

    shape: ModelShape
    acts: Activations | None
    batch: int
    seq: int | None
    """Tokens per sample (token models), else None."""
    task: str
    ce_kernel: str
    compute_bytes: int
    dims: ab.DecoderDims | None = None
    """kiln's decoder: its activations are counted from these shapes (then `acts` is None)."""
    widths: ab.Widths | None = None
    swiglu: str = "plain"
    attention: str = "flash"
    autocast: bool = False
    accumulating: bool = False
    compiled: bool = False


def model_shape(built: BuiltModel, cfg: Config, gather_bytes: int) -> ModelShape:
    """Parameter counts of `built` (on the meta device): total, FSDP2 units as kiln would group them,
    matmul weights, and the logits' width."""
    module = built.module
    params = {id(p): p.numel() for p in module.parameters()}
    units = []
    for unit in fsdp_units(module, built.blocks, cfg.distributed, gather_bytes) if built.blocks else []:
        members = unit if isinstance(unit, list) else [unit]
        units.append(sum({id(p): p.numel() for m in members for p in m.parameters()}.values()))
    linears = {id(m.weight): m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear)}
    spec = built.input_spec
    vocab = (spec.vocab_size or spec.num_classes or 0) if spec is not None else 0
    return ModelShape(params=sum(params.values()), units=tuple(units), matmul_params=sum(linears.values()),
                      vocab=vocab)


def run_setup(cfg: Config, strategy: str, world_size: int, policy: PrecisionPolicy, num_params: int) -> Setup:
    """How this run holds its state (kiln.train.gpu_memory.Setup) for `strategy` at `world_size`."""
    d = cfg.distributed
    gather = _width(policy.autocast_dtype or policy.param_dtype) if d.fsdp_param_dtype == "auto" \
        else _BYTES[d.fsdp_param_dtype]
    return Setup(strategy=strategy, world_size=world_size, param_bytes=_width(policy.param_dtype),
                 optimizer_slots=optimizer_slots(cfg.optim.name, cfg.optim.momentum),
                 master_weights=policy.master_weights,
                 autocast_bytes=_width(policy.autocast_dtype) if policy.autocast_dtype is not None else None,
                 gather_bytes=gather, reduce_bytes=_BYTES[d.fsdp_reduce_dtype],
                 reshard_after_forward=reshards_after_forward(d, num_params * gather),
                 prefetch=max(1, d.fsdp_forward_prefetch), ddp_bucket_views=d.ddp_gradient_as_bucket_view,
                 compiled=cfg.compile.enabled)


def decoder_dims(module: torch.nn.Module) -> ab.DecoderDims | None:
    """The shapes of a kiln decoder whose blocks are the ones kiln.train.activation_bytes counts
    (Llama's: RMSNorm, grouped-query attention without q/k norms or sliding windows, SwiGLU); None
    for any other model."""
    if not isinstance(module, Decoder):
        return None
    c = module.config
    plain = all(type(b) is Block and type(b.attn) is Attention and type(b.attn_norm) is RMSNorm
                and type(b.ffn_norm) is RMSNorm and isinstance(b.ffn, FeedForward) for b in module.layers)
    if not plain or c.qk_norm or any(c.layer_window(i) is not None for i in range(c.n_layers)):
        return None
    return ab.DecoderDims(c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size)


def measure(built: BuiltModel, cfg: Config, setup: Setup) -> Measured:
    """The model's shape and what one micro-batch keeps: kiln's decoder by its shapes, other models
    measured on the meta device in the compute dtype (the gathered dtype under FSDP2, autocast's
    otherwise, else the parameters')."""
    residual = setup.gather_bytes if setup.strategy == "fsdp" else setup.param_bytes
    compute = setup.gather_bytes if setup.strategy == "fsdp" else (setup.autocast_bytes or setup.param_bytes)
    dtype = {4: torch.float32, 2: torch.bfloat16}[compute]
    try:
        shape = model_shape(built, cfg, setup.gather_bytes)
    except ConfigError:  # distributed.fsdp_wrap names no module of this model: bad input under FSDP2 only
        if setup.strategy == "fsdp":
            raise
        shape = model_shape(dataclasses.replace(built, blocks=[]), cfg, setup.gather_bytes)
    dims = decoder_dims(built.module)
    acts = saved_activations(built, cfg, dtype, logits=False) if own_model(cfg) and dims is None else None
    spec = built.input_spec
    seq = resolve_seq_len(cfg.data.seq_len, spec) if spec is not None and spec.kind == "tokens" else None
    kernel = resolve_ce_kernel(cfg.training.ce_kernel, built.hidden_states and built.task == "causal_lm")
    matmul = min(residual, setup.autocast_bytes or residual)
    attention = cfg.model.attention if cfg.model.attention in ab.ATTENTION_STATS_PAD else "flash"
    return Measured(shape=shape, acts=acts, batch=cfg.data.batch_size, seq=seq, task=built.task,
                    ce_kernel=kernel, compute_bytes=compute, dims=dims, widths=ab.Widths(residual, matmul),
                    swiglu=resolve_swiglu_kernel(cfg.training.swiglu_kernel, built.module, torch.device("cuda")),
                    attention=attention, autocast=setup.autocast_bytes is not None,
                    accumulating=cfg.training.grad_accum_steps > 1, compiled=cfg.compile.enabled)


def decoder_step(m: Measured, *, checkpointing: str, batch: int, seq: int) -> StepMemory:
    """One micro-batch of kiln's decoder, counted from its shapes (kiln.train.activation_bytes)."""
    d, w = m.dims, m.widths
    micro = ab.Micro(batch, seq, m.swiglu, m.attention, m.compiled)
    tokens = micro.tokens
    kernel = "plain" if m.ce_kernel in ("plain", "triton") else "chunked"  # triton: plain's logits, no fp32 copy
    loss_back = 2 * tokens * d.vocab * (4 if m.autocast else w.matmul) if kernel == "plain" else 0
    return StepMemory(activations=ab.activations_saved(d, w, micro, checkpointing),
                      loss=ab.loss_saved(d, w, tokens, kernel, m.autocast),
                      loss_transient=ab.loss_transient(d, w, tokens, kernel, m.autocast, chunk_tokens(d.vocab)),
                      backward_transient=max(ab.recompute_bytes(d, w, micro, checkpointing), loss_back),
                      accumulating=m.accumulating)


def plan_of(m: Measured, setup: Setup, *, checkpointing: str, batch: int, seq: int | None) -> GpuPlan:
    """The plan at another checkpointing mode, batch size or sequence length (a measured model's
    activations and logits scale with the tokens of a micro-batch: attention runs in fused
    kernels, linear in length)."""
    if m.dims is not None and seq:
        plan = plan_gpu(m.shape, setup, decoder_step(m, checkpointing=checkpointing, batch=batch, seq=seq))
        return dataclasses.replace(plan, checkpointing=checkpointing)
    scale = (batch * (seq or 1)) / (m.batch * (m.seq or 1))
    activations = math.ceil(m.acts.total(checkpointing) * scale) if m.acts is not None else 0
    if m.task == "causal_lm" and seq:
        logits = logits_bytes(batch * seq, m.shape.vocab, m.ce_kernel, m.compute_bytes, CHUNK_LOGIT_BYTES)
    else:
        logits = batch * m.shape.vocab * (m.compute_bytes + 8)
    plan = plan_gpu(m.shape, setup, StepMemory(activations, loss_transient=logits, accumulating=m.accumulating))
    plan = dataclasses.replace(plan, checkpointing=checkpointing)
    plan.notes.append("activations measured on the meta device (a model kiln.train.activation_bytes does not count)"
                      if m.acts is not None else
                      "activations not measured (a user model, or one that does not run on the meta device)")
    return plan


def fixes(m: Measured, setup: Setup, ac: str, free: int, capacity: int) -> list[str]:
    """Single changes to this run (planned at checkpointing mode `ac`) that would make it fit, in order
    of what they cost: more recomputation, a smaller batch, shorter sequences, more ranks, sharding."""
    batch, seq = m.batch, m.seq
    here = {"checkpointing": ac, "batch": batch, "seq": seq}

    def ok(setup_=setup, **change) -> bool:
        return fits(plan_of(m, setup_, **{**here, **change}).reserved, free, capacity)

    out = []
    for mode in AC_ORDER[AC_ORDER.index(ac) + 1:] if ac in AC_ORDER and m.shape.units else ():
        if ok(checkpointing=mode):
            out.append(f"training.activation_checkpointing={mode}")
            break
    if batch > 1 and (b := max((b for b in range(1, batch) if ok(batch=b)), default=0)):
        out.append(f"data.batch_size={b}")
    if seq and seq > 1:
        lo, hi = 0, seq - 1  # the longest length that fits, by bisection (the plan grows with it)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if ok(seq=mid) else (lo, mid - 1)
        if lo:
            out.append(f"data.seq_len={lo}")
    sharded = setup if setup.strategy == "fsdp" else dataclasses.replace(setup, strategy="fsdp")
    if setup.strategy != "fsdp" and ok(sharded):
        out.append("distributed.strategy=fsdp")
    else:
        world = next((w for w in range(setup.world_size + 1, MAX_RANKS + 1)
                      if ok(dataclasses.replace(sharded, world_size=w))), None)
        if world is not None:
            fsdp = "" if setup.strategy == "fsdp" else " with distributed.strategy=fsdp"
            out.append(f"{world} ranks (--nproc-per-node, or more nodes){fsdp}")
    return out


def _key(option: str) -> str:
    return "--nproc-per-node" if option[0].isdigit() else option.split("=")[0]


def check_fits(plan: GpuPlan, m: Measured, *, free: int, capacity: int, where: str) -> None:
    """ConfigError (exit 2) naming what would fit when `plan` does not fit `free` of `capacity` bytes."""
    if fits(plan.reserved, free, capacity):
        return
    parts = ", ".join(f"{name} {gib(n)}" for name, n in plan.parts.items() if n)
    parts += f"; allocated peak {gib(plan.total)} + allocator slack {gib(plan.slack)}"
    options = fixes(m, plan.setup, plan.checkpointing, free, capacity)
    advice = ("it fits with any one of: " + "; ".join(options)) if options else \
        "no single setting makes it fit: a smaller model, or devices with more memory"
    s = plan.setup
    raise ConfigError(_key(options[0]) if options else "model.name",
                      f"this run needs about {gib(plan.reserved)} per rank ({s.strategy}, {s.world_size} "
                      f"rank{'s' if s.world_size > 1 else ''}: {parts}); {where} has {gib(free)} free of "
                      f"{gib(capacity)}, {HEADROOM:.0%} of it kept as headroom: {advice} ({SKIP_ENV}=1 tries anyway)")


def measured_peak(device: torch.device) -> dict[str, int] | None:
    """The most any rank allocated and reserved (CUDA allocator) since the last peak reset; None off
    CUDA. A collective under several ranks: call it on every rank."""
    if device.type != "cuda":
        return None
    import torch.distributed as dist

    peaks = torch.tensor([torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)],
                         dtype=torch.int64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    allocated, reserved = (int(v) for v in peaks.tolist())
    return {"max_allocated_bytes": allocated, "max_reserved_bytes": reserved}


def plan_record(plan: GpuPlan | None, measured: dict[str, int] | None) -> dict[str, Any] | None:
    """The plan as summary.json keeps it (`memory_plan`), the measured peak (max over ranks) beside it."""
    if plan is None:
        return None
    record = {"parts": dict(plan.parts), "total_bytes": plan.total, "phases": dict(plan.phases),
              "slack_bytes": plan.slack, "reserved_bytes": plan.reserved, "strategy": plan.setup.strategy,
              "world_size": plan.setup.world_size, "setup": dataclasses.asdict(plan.setup),
              "checkpointing": plan.checkpointing,
              "notes": list(plan.notes), "measured": measured}
    if measured:
        record["allocated_over_plan"] = round(measured["max_allocated_bytes"] / plan.total, 4)
        record["reserved_over_plan"] = round(measured["max_reserved_bytes"] / plan.reserved, 4)
    return record


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """(free, total) bytes of a CUDA device as this process sees it; None elsewhere."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


def plan_run(cfg: Config, strategy: str, world_size: int, policy: PrecisionPolicy, *,
             memory: tuple[int, int] | None, where: str, announce: bool) -> GpuPlan | None:
    """The run's plan per rank (None when the model cannot be built on the meta device), refused
    (ConfigError, exit 2) when `memory` = (free, total) bytes is given and it does not fit
    (`KILN_SKIP_MEMORY_CHECK=1` only warns). `announce`: log the table (rank 0, the launcher)."""
    built = meta_model(cfg)
    if built is None:
        return None
    num = sum(p.numel() for p in built.module.parameters())
    setup = run_setup(cfg, strategy, world_size, policy, num)
    m = measure(built, cfg, setup)
    ac = choose_checkpointing(m, setup, cfg.training.activation_checkpointing, memory)
    plan = keep_gathered(m, setup, cfg, memory, ac) or plan_of(m, setup, checkpointing=ac, batch=m.batch, seq=m.seq)
    if cfg.training.activation_checkpointing == "auto":
        why = "the least recomputation whose plan fits" if memory is not None else "no device figures to choose by"
        plan.notes.append(f"training.activation_checkpointing=auto: {ac} ({why})")
    if cfg.precision.float8 != "none":
        plan.notes.append("float8: weights, gathers and activations planned in the compute dtype (torchao's "
                          "float8 casts are transient)")
    if announce:
        log.info(table(plan))
    if memory is not None:
        try:
            check_fits(plan, m, free=memory[0], capacity=memory[1], where=where)
        except ConfigError as exc:
            if os.environ.get(SKIP_ENV) != "1":
                raise
            log.warning("%s", exc)
    return plan


def choose_checkpointing(m: Measured, setup: Setup, asked: str, memory: tuple[int, int] | None) -> str:
    """The activation checkpointing mode the run uses: `asked`, or under `auto` the first of AC_ORDER
    whose plan fits the device (`memory` = (free, total) bytes, HEADROOM kept), `full` when none does
    (the fit check then names what would); `none` without device figures or repeated blocks."""
    if asked != "auto":
        return asked
    if memory is None or not m.shape.units:
        return "none"
    for mode in AC_ORDER:
        if fits(plan_of(m, setup, checkpointing=mode, batch=m.batch, seq=m.seq).reserved, *memory):
            return mode
    return AC_ORDER[-1]


def planned_checkpointing(plan: GpuPlan | None, asked: str) -> str:
    """`training.activation_checkpointing` as the run applies it: `asked`, or for `auto` the mode the
    memory plan chose (`none` without a plan). Ranks whose GPUs differ may choose differently; the
    collectives of a step are the same in every mode."""
    return plan.checkpointing if asked == "auto" and plan is not None else without_plan(asked)


def keep_gathered(m: Measured, setup: Setup, cfg: Config, memory: tuple[int, int] | None,
                  ac: str) -> GpuPlan | None:
    """Under `fsdp_reshard_after_forward=auto`, the plan (at checkpointing mode `ac`) with FSDP2's units
    kept gathered from forward to backward, where the size rule reshards them and that plan reserves
    at most KEEP_SHARE of the device's capacity and fits its free memory (`memory` = (free, total) bytes), so `auto` never
    refuses a run that fits resharded; else None. Ranks that decide differently (other GPU models,
    memory another process holds) are made to agree by kiln.distributed.fsdp.apply_fsdp."""
    if (memory is None or setup.strategy != "fsdp" or not setup.reshard_after_forward
            or cfg.distributed.fsdp_reshard_after_forward is not None):
        return None
    kept = dataclasses.replace(setup, reshard_after_forward=False)
    plan = plan_of(m, kept, checkpointing=ac, batch=m.batch, seq=m.seq)
    free, capacity = memory
    if plan.reserved > KEEP_SHARE * capacity or not fits(plan.reserved, free, capacity):
        return None
    plan.notes.append(f"distributed.fsdp_reshard_after_forward=auto: FSDP2 units kept gathered from forward to "
                      f"backward (the plan reserves {gib(plan.reserved)}, within {KEEP_SHARE:.0%} of {gib(capacity)})")
    return plan


def planned_reshard(plan: GpuPlan | None, strategy: str) -> bool | None:
    """FSDP2's reshard-after-forward as the run's memory plan decided it, for a run sharded as
    planned; None (the size rule) without a plan or for another strategy."""
    if plan is None or strategy != "fsdp" or plan.setup.strategy != "fsdp":
        return None
    return plan.setup.reshard_after_forward


def launcher_device_memory(ranks: int) -> tuple[int, int] | None:
    """(least free, total) bytes over the first `ranks` visible GPUs, read through NVML, which opens no
    CUDA context in the launcher (one would hold GPU memory through the run); None without NVML."""
    pynvml = import_nvml()
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
        try:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            indices = [int(i) for i in visible.split(",")] if visible else list(range(pynvml.nvmlDeviceGetCount()))
            infos = [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
                     for i in indices[:max(1, ranks)]]
        finally:
            pynvml.nvmlShutdown()
    except (pynvml.NVMLError, ValueError):  # no driver, or GPUs named by UUID in CUDA_VISIBLE_DEVICES
        return None
    if not infos:
        return None
    return min(int(i.free) for i in infos), min(int(i.total) for i in infos)
