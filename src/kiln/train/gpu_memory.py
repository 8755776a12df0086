"""Device memory one rank of a training run needs, part by part: the arithmetic of the GPU memory plan.

Everything here is explicit numbers in, bytes out, so each part has an exact test; what the numbers
are for a config (the model's shape measured on the meta device, the activations of a micro-batch,
the device's free memory) and the refusal of a run that cannot fit are in kiln.train.gpu_plan.

Per rank, in the order the table prints them:
- parameters, gradients: every parameter in its storage dtype (fp32 under fp32 and bf16-mixed, bf16
  under bf16-true and bf16-master), sharded 1/world under FSDP2 (rounded up per rank);
- optimizer state: `slots` values per parameter (AdamW: 2) in the storage dtype, in fp32 with fp32
  master weights (bf16-master: the moments and the master copy), sharded under FSDP2;
- bucket / weight copies: DDP's gradient buckets when they are not views of the gradients; one
  process or DDP under autocast keeps a 16-bit copy of every matmul weight for the forward
  (autocast's cast cache);
- all-gather buffers (FSDP2), at the peak (the end of the forward, the start of backward): the
  root's parameters (embeddings, head: gathered through forward and backward), and either every
  unit gathered (no resharding after forward) or the last unit (kept gathered for backward) plus
  the `prefetch` units gathered ahead of it (of the largest), in the gathered dtype;
- reduce-scatter buffers (FSDP2): the largest unit's unsharded gradients in the gathered dtype,
  twice (one unit reducing while the next computes), and its reduce-scatter input in the reduce dtype;
- activations: what a micro-batch's forward keeps for backward under the run's activation
  checkpointing (kiln's decoder: counted from its shapes, kiln.train.activation_bytes; other
  models: measured on the meta device, kiln.train.memory_plan.saved_activations);
- logits + loss: what the loss keeps for backward (the chunked kernel: its gradients of the hidden
  states and of the output weight; plain cross-entropy: its log-softmax);
- loss transient: the loss's own peak during the forward (plain: the logits; chunked: one chunk);
- backward transient: what backward adds on top: a checkpointed block recomputed, the gradient of
  the largest activation;
- workspace: a stated allowance for cuBLAS/cuDNN and attention workspaces, and torch.compile's
  temporaries when it compiles.

The allocated peak is the largest of three moments, not the sum of the parts: the end of the
forward (loss transient), the start of backward (reduce-scatter buffers, backward transient) and
the optimizer step (gradients; they are set to None after each step, so the forward and backward
of a step without gradient accumulation hold none). The caching allocator reserves more than
tensors hold: `slack` models that difference as a share of the per-step bytes (everything but the
parameters, gradients and optimizer state, which are allocated once and do not fragment); the
reserved figure, allocated peak + slack, is what a run is refused on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

GIB = 2**30
# cuBLAS / cuDNN workspaces, attention's softmax statistics, the caching allocator's rounding.
WORKSPACE_BYTES = GIB
# What Inductor's compiled kernels add on top (temporaries of fused regions, autotuning buffers).
COMPILE_WORKSPACE_BYTES = GIB
# Share of the device kept free beyond the plan's reserved figure: NCCL's buffers and the CUDA
# context take memory the caching allocator does not count.
HEADROOM = 0.03
# The caching allocator's reserved-but-unallocated bytes, as a share of the per-step bytes (the
# allocated peak less parameters, gradients and optimizer state): blocks cached at the sizes of
# activations, gathers and the loss's chunks that later requests of other sizes cannot reuse.
# A documented model calibrated on measured runs (docs/guide/training.md), not a bound.
SLACK_SHARE = 0.5
STATE_PARTS = ("parameters", "gradients", "optimizer state", "DDP gradient buckets", "autocast weight copies")

Strategy = Literal["none", "ddp", "fsdp"]


@dataclass(frozen=True)
class ModelShape:
    """Parameter counts of the model, as the plan needs them (a tied weight counted once)."""

    params: int
    units: tuple[int, ...] = ()
    """Parameters of each FSDP2 unit in forward order (consecutive blocks grouped); the root holds the rest."""
    matmul_params: int = 0
    """Parameters of the linear layers' weights (what autocast caches a 16-bit copy of)."""
    vocab: int = 0
    """Output classes or vocabulary: the width of the logits."""

    @property
    def root(self) -> int:
        return self.params - sum(self.units)


@dataclass(frozen=True)
class Setup:
    """How the run holds its state: strategy and world, dtypes (bytes per element), optimizer."""

    strategy: Strategy
    world_size: int
    param_bytes: int
    """The parameters' storage dtype."""
    optimizer_slots: int = 2
    master_weights: bool = False
    """fp32 master weights in the optimizer (bf16-master): moments and masters in fp32."""
    autocast_bytes: int | None = None
    """The compute dtype of a mixed policy (2 for bf16-mixed); None without autocast."""
    gather_bytes: int = 2
    """FSDP2: the dtype parameters are gathered (and gradients computed) in."""
    reduce_bytes: int = 4
    """FSDP2: the dtype gradients are reduce-scattered in."""
    reshard_after_forward: bool = True
    prefetch: int = 1
    """FSDP2: units whose all-gather runs ahead of the one computing (explicit depth, or 1: FSDP2's own)."""
    ddp_bucket_views: bool = True
    compiled: bool = False


@dataclass(frozen=True)
class StepMemory:
    """One micro-batch's bytes beyond the model's state (kiln.train.activation_bytes)."""

    activations: int
    """Kept for backward at the end of the forward."""
    loss: int = 0
    """Kept for backward by the loss."""
    loss_transient: int = 0
    backward_transient: int = 0
    accumulating: bool = False
    """Gradient accumulation: the gradients are held through the later micro-batches' forward and backward."""


@dataclass
class GpuPlan:
    """Bytes per rank, by part (in the module docstring's order), the moments they peak at, and what was assumed."""

    parts: dict[str, int]
    setup: Setup
    phases: dict[str, int] = field(default_factory=dict)
    """Allocated bytes at the end of the forward, the start of backward and the optimizer step."""
    persistent: int = 0
    """Parameters, optimizer state (and gradients where held) at the peak: allocated once, no slack."""
    notes: list[str] = field(default_factory=list)
    checkpointing: str = "none"
    """The activation checkpointing mode the activations were planned at."""

    @property
    def total(self) -> int:
        """The allocated peak (what torch.cuda.max_memory_allocated measures): the largest phase."""
        return max(self.phases.values()) if self.phases else sum(self.parts.values())

    @property
    def slack(self) -> int:
        """The allocator's expected reserved-but-unallocated bytes at the peak (SLACK_SHARE's model)."""
        return int(SLACK_SHARE * max(0, self.total - self.persistent))

    @property
    def reserved(self) -> int:
        """The reserved peak the plan expects (torch.cuda.max_memory_reserved): what a run is refused on."""
        return self.total + self.slack


def shard(n: int, setup: Setup) -> int:
    """Elements of `n` a rank holds: all of them, or 1/world rounded up under FSDP2."""
    return -(-n // setup.world_size) if setup.strategy == "fsdp" else n


def state_parts(shape: ModelShape, setup: Setup) -> dict[str, int]:
    """Parameters, gradients, optimizer state and the strategy's extra copies, per rank."""
    local = shard(shape.params, setup)
    state_bytes = 4 if setup.master_weights else setup.param_bytes
    parts = {
        "parameters": local * setup.param_bytes,
        "gradients": local * setup.param_bytes,
        "optimizer state": local * (setup.optimizer_slots * state_bytes + (4 if setup.master_weights else 0)),
    }
    if setup.strategy == "ddp" and not setup.ddp_bucket_views:
        parts["DDP gradient buckets"] = shape.params * setup.param_bytes
    if setup.strategy != "fsdp" and setup.autocast_bytes is not None and setup.autocast_bytes < setup.param_bytes:
        parts["autocast weight copies"] = shape.matmul_params * setup.autocast_bytes
    return parts


def fsdp_parts(shape: ModelShape, setup: Setup) -> dict[str, int]:
    """FSDP2's all-gather and reduce-scatter buffers, per rank (none for other strategies)."""
    if setup.strategy != "fsdp" or not shape.params:
        return {}
    units = shape.units or (shape.params,)
    largest = max(units)
    if setup.reshard_after_forward and len(units) > 1:
        gathered_units = units[-1] + setup.prefetch * largest
    else:
        gathered_units = sum(units)
    root = shape.root if shape.units else 0
    return {
        "all-gather buffers": (root + gathered_units) * setup.gather_bytes,
        "reduce-scatter buffers": largest * (2 * setup.gather_bytes + setup.reduce_bytes),
    }


def logits_bytes(tokens: int, vocab: int, kernel: str, compute_bytes: int, chunk_bytes: int) -> int:
    """Peak of the logits and the loss for `tokens` tokens: plain cross-entropy's logits (compute
    dtype), fp32 log-softmax and fp32 gradient; a chunked kernel's one chunk (at most `chunk_bytes`
    of fp32 logits) and its gradient."""
    if kernel == "plain":
        return tokens * vocab * (compute_bytes + 4 + 4)
    return 2 * min(tokens * vocab * 4, max(vocab * 4, chunk_bytes))


def plan_gpu(shape: ModelShape, setup: Setup, step: StepMemory) -> GpuPlan:
    """The plan of one rank for one micro-batch's `step` bytes: its parts and the three moments' sums."""
    parts = {**state_parts(shape, setup), **fsdp_parts(shape, setup), "activations": step.activations,
             "logits + loss": step.loss, "loss transient": step.loss_transient,
             "backward transient": step.backward_transient,
             "workspace (allowance)": WORKSPACE_BYTES + (COMPILE_WORKSPACE_BYTES if setup.compiled else 0)}
    state = sum(n for name, n in parts.items() if name in STATE_PARTS)
    held = state - (0 if step.accumulating else parts["gradients"])  # None between steps without accumulation
    kept = held + parts.get("all-gather buffers", 0) + step.activations + step.loss + parts["workspace (allowance)"]
    phases = {"forward end": kept + step.loss_transient,
              "backward start": kept + parts.get("reduce-scatter buffers", 0) + step.backward_transient,
              "optimizer step": state + parts["workspace (allowance)"]}
    peak = max(phases, key=phases.get)
    return GpuPlan(parts, setup, phases, persistent=state if peak == "optimizer step" else held)


def fits(reserved: int, free: int, capacity: int) -> bool:
    """Whether a plan's `reserved` bytes fit in `free` bytes of a `capacity`-byte device, HEADROOM kept."""
    return reserved <= free - HEADROOM * capacity


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def table(plan: GpuPlan) -> str:
    """The short table printed at the start (rank 0)."""
    s = plan.setup
    head = f"GPU memory plan per rank ({s.strategy}, {s.world_size} rank{'s' if s.world_size > 1 else ''}):"
    width = max(len(k) for k in plan.parts)
    width = max(width, len("reserved (allocated + slack)"))
    rows = [f"  {name:<{width}}  {gib(n):>10}" for name, n in plan.parts.items() if n]
    moments = ", ".join(f"{name} {gib(n)}" for name, n in plan.phases.items())
    return "\n".join([head, *rows, f"  {'allocated peak':<{width}}  {gib(plan.total):>10}  (largest of: {moments})",
                      f"  {'allocator slack (model)':<{width}}  {gib(plan.slack):>10}",
                      f"  {'reserved (allocated + slack)':<{width}}  {gib(plan.reserved):>10}"])
