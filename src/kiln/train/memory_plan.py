"""Host memory a CPU training run needs, estimated before anything is built, and the refusal (exit 2,
in seconds) of a run that cannot fit, naming the setting that would.

The kernel's OOM killer otherwise finds out after minutes (of compiling, of building weights) and
leaves no message. The estimate is built on the meta device, so it costs no memory and no
compute: the model's parameters, then one forward of a micro-batch of meta tensors under autograd's
saved-tensor hooks, which see every activation backward will read (its real shapes, per repeated
block), plus the loss's fp32 log-softmax of the logits. Only kiln's own models (the registry,
`llama:`, `hf:`, `timm:`) run that forward: a user's may do host work or have side effects. On top of the weights: gradients and optimizer state in the policy's dtypes,
the activations (only each block's input under `training.activation_checkpointing`, plus the one
block recomputed at a time), and the largest saved tensor once more for its gradient. Not counted:
what torch.compile itself takes while compiling, allocator slack, DataLoader workers; so a run that
passes may still be close, but one refused here could not have run.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.config.schema import Config
from kiln.data.base import resolve_seq_len
from kiln.errors import ConfigError
from kiln.models import build_model
from kiln.models.host_memory import gib, host_memory, optimizer_slots
from kiln.models.registry import REGISTRY
from kiln.models.spec import BuiltModel
from kiln.precision import resolve_precision
from kiln.train.activation_checkpoint import SAVED_OPS, without_plan
from kiln.train.cross_entropy import resolve_ce_kernel

SKIP_ENV = "KILN_SKIP_MEMORY_CHECK"
# Settings that only pay on a GPU: named when a config holding them is refused on a CPU.
GPU_SETTINGS = (("training.ce_kernel", "triton"), ("compile.cudagraphs", True), ("precision.float8", "tensorwise"),
                ("precision.float8", "rowwise"), ("precision.policy", "bf16-master"))


@dataclass
class Activations:
    outside: int = 0
    """Bytes saved for backward outside the repeated blocks (embeddings, head, loss)."""
    per_block: list[int] | None = None
    """Bytes saved inside each repeated block."""
    block_inputs: int = 0
    """Bytes of the blocks' inputs (what full activation checkpointing keeps)."""
    largest: int = 0
    """The largest single saved tensor (its gradient is as large, once)."""
    selective: list[int] | None = None
    """Bytes of each block's matmul and attention outputs: what `selective` checkpointing keeps
    (kiln.train.activation_checkpoint); None when not measured."""

    def total(self, checkpointing: str) -> int:
        blocks = self.per_block or []
        if checkpointing == "none" or not blocks:
            kept = self.outside + sum(blocks)
        else:  # each block's input kept, one block's activations alive while it is recomputed
            kept = self.outside + self.block_inputs + max(blocks)
            if checkpointing == "selective":  # matmul and attention outputs kept (about half when not measured)
                kept += sum(self.selective) if self.selective is not None else sum(blocks) // 2
        return kept + self.largest


def _meta_inputs(built: BuiltModel, cfg: Config) -> tuple[torch.Tensor, torch.Tensor] | None:
    spec, batch = built.input_spec, cfg.data.batch_size
    if spec is None:
        return None
    if spec.kind == "tokens":
        seq = resolve_seq_len(cfg.data.seq_len, spec)
        tokens = torch.empty((batch, seq), dtype=torch.long, device="meta")
        return tokens, tokens
    inputs = torch.empty((batch, *spec.shape), dtype=torch.float32, device="meta")
    return inputs, torch.empty((batch,), dtype=torch.long, device="meta")


def spec_kind(built: BuiltModel) -> str | None:
    return built.input_spec.kind if built.input_spec is not None else None


class _SelectiveOutputs(TorchDispatchMode):
    """Adds up, per block, the outputs of the ops selective checkpointing keeps."""

    def __init__(self, acts: Activations, where: list[int], square: int | None):
        super().__init__()
        self.acts, self.where, self.square = acts, where, square

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.where[0] >= 0 and func in SAVED_OPS:
            first = out[0] if isinstance(out, tuple) else out
            if isinstance(first, torch.Tensor) and not (self.square and first.shape[-2:] == (self.square,) * 2):
                self.acts.selective[self.where[0]] += first.numel() * first.element_size()
        return out


def saved_activations(built: BuiltModel, cfg: Config, dtype: torch.dtype, *, logits: bool = True) -> Activations | None:
    """What one micro-batch's forward + loss saves for backward, measured on the meta device
    (None when the model cannot run there: a user model doing host work, say). `logits=False`: a
    causal LM's forward stops at its hidden states (the GPU plan counts logits and loss itself)."""
    batch = _meta_inputs(built, cfg)
    if batch is None:
        return None
    model = built.module.to(dtype)
    params = {id(p) for p in model.parameters()}
    acts = Activations(per_block=[0] * len(built.blocks), selective=[0] * len(built.blocks))
    seen: set[int] = set()
    where = [-1]  # index of the block running, -1 outside
    square = batch[1].shape[-1] if spec_kind(built) == "tokens" else None  # the sequence length

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(base) in params or id(base) in seen or (square and base.shape[-2:] == (square, square)):
            return t  # parameters; a tensor seen already; [seq x seq] attention (fused kernels keep none)
        seen.add(id(base))
        size = base.numel() * base.element_size()
        acts.largest = max(acts.largest, size)
        if where[0] < 0:
            acts.outside += size
        else:
            acts.per_block[where[0]] += size
        return t

    def enter(i):
        def hook(module, args, kwargs=None):
            where[0] = i
            first = args[0] if args else None
            if isinstance(first, torch.Tensor):
                acts.block_inputs += first.numel() * first.element_size()
        return hook

    def leave(module, args, output):
        where[0] = -1

    handles = []
    for i, block in enumerate(built.blocks):
        handles.append(block.register_forward_pre_hook(enter(i)))
        handles.append(block.register_forward_hook(leave))
    ce_kernel = resolve_ce_kernel(cfg.training.ce_kernel, built.hidden_states and built.task == "causal_lm")
    inputs, targets = batch
    if dtype != torch.float32 and inputs.is_floating_point():
        inputs = inputs.to(dtype)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _SelectiveOutputs(acts, where, square):
            if built.task == "custom":  # the model computes its own loss
                model(inputs, targets)
            elif ce_kernel in ("chunked", "liger") or (not logits and built.hidden_states):  # hidden states only
                model(inputs, hidden=True)
            else:  # the loss keeps log-softmax of the logits, in fp32: as large as fp32 logits
                output = model(inputs)
                logits = output if isinstance(output, torch.Tensor) else getattr(output, "logits", None)
                if isinstance(logits, torch.Tensor):
                    size = logits.numel() * 4
                    acts.outside += size
                    acts.largest = max(acts.largest, size)
    except Exception:
        return None
    finally:
        for h in handles:
            h.remove()
    return acts


@dataclass
class HostPlan:
    parts: dict[str, int]
    """What needs host memory, in bytes: weights, gradients, optimizer state, activations."""
    activations_per_sample: int
    num_params: int
    has_blocks: bool = False

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def own_model(cfg: Config) -> bool:
    """Kiln's own models (the registry, `llama:`, `hf:`, `timm:`): the ones whose forward the plans run
    on the meta device (a user's may do host work, or have side effects, even there)."""
    return cfg.model.name in REGISTRY or cfg.model.name.startswith(("llama:", "hf:", "timm:"))


def meta_model(cfg: Config) -> BuiltModel | None:
    """The model built on the meta device (shapes only: no memory, no compute), or None when its
    factory cannot build there. Bad input (ConfigError) is raised."""
    try:
        with torch.device("meta"):
            return build_model(cfg.model)
    except ConfigError:
        raise
    except Exception:
        return None


def plan_host_memory(cfg: Config, device_type: str) -> HostPlan | None:
    """The host bytes a run of `cfg` needs (see the module docstring); None when the model cannot
    be built on the meta device."""
    built = meta_model(cfg)
    if built is None:
        return None
    num = sum(p.numel() for p in built.module.parameters())
    if device_type != "cpu":  # the model passes through the host once, as built (fp32)
        return HostPlan({"fp32 weights as built": num * 4}, 0, num, bool(built.blocks))
    policy = resolve_precision(cfg.precision.policy, torch.device("cpu"))
    width = torch.finfo(policy.param_dtype).bits // 8
    slots = optimizer_slots(cfg.optim.name, cfg.optim.momentum)
    parts = {"weights": num * width, "gradients": num * width,
             "optimizer state": num * (slots * (4 if policy.master_weights else width) + (4 if policy.master_weights
                                                                                            else 0))}
    acts = saved_activations(built, cfg, policy.param_dtype) if own_model(cfg) else None
    per_sample = 0
    if acts is not None:
        activations = acts.total(without_plan(cfg.training.activation_checkpointing))  # a CPU has no device plan
        if policy.autocast_dtype is not None:  # autocast keeps matmul outputs in 16 bits
            activations = activations * torch.finfo(policy.autocast_dtype).bits // 32
        parts[f"activations (batch {cfg.data.batch_size})"] = activations
        per_sample = activations // max(1, cfg.data.batch_size)
    return HostPlan(parts, per_sample, num, bool(built.blocks))


def check_run_fits(cfg: Config, device_type: str) -> HostPlan | None:
    """ConfigError (exit 2) when the run's host memory (`plan_host_memory`) exceeds what this host
    has available: the parts named, and the batch size that would fit, or that no batch size does.
    `KILN_SKIP_MEMORY_CHECK=1` skips it."""
    if os.environ.get(SKIP_ENV) == "1":
        return None
    total, available = host_memory()
    if available is None:
        return None
    plan = plan_host_memory(cfg, device_type)
    if plan is None or plan.total <= available:
        return plan
    parts = ", ".join(f"{name} {gib(n)}" for name, n in plan.parts.items())
    fixed = plan.total - plan.activations_per_sample * cfg.data.batch_size
    if plan.activations_per_sample and fixed < available:
        fits = math.floor((available - fixed) / plan.activations_per_sample)
        knob = (f"data.batch_size={fits} fits" if fits >= 1 else "no batch size fits at this data.seq_len")
        if cfg.training.activation_checkpointing in ("none", "auto") and plan.has_blocks:
            knob += "; training.activation_checkpointing=full keeps less"
    else:
        knob = "the model alone does not fit: a smaller model, or a machine with more memory"
    gpu = [f"{k}={str(v).lower()}" for k, v in GPU_SETTINGS if _value(cfg, k) == v]
    meant = f"; this config is meant for a GPU ({', '.join(gpu)})" if gpu and device_type == "cpu" else ""
    raise ConfigError("data.batch_size" if "fits" in knob else "model.name",
                      f"this run of {plan.num_params / 1e9:.2f}B parameters needs about {gib(plan.total)} of host "
                      f"memory ({parts}); this host has "
                      f"{gib(available)} available of {gib(total)}: {knob}{meant} ({SKIP_ENV}=1 tries anyway)")


def _value(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)
