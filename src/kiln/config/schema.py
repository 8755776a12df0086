"""The configuration tree of a kiln run.

Each section is a keyword-only dataclass; the string literal under each field is its
documentation (read by `kiln.config.reference` to generate docs/reference.md, so keep one
per field). A closed set of values is a `Literal` field type, and a yes/no choice with a default
that kiln decides is `bool | None` (`None` is spelled `auto` in TOML and overrides); validation and
the reference read the choices from those types (`kiln.config.choices`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# Closed sets of values. Compile mode/backend/options are checked against the installed torch
# instead (see validate.py), since they change between torch releases.
Task = Literal["auto", "classification", "causal_lm", "custom"]
Attention = Literal["auto", "flash", "cudnn", "efficient", "math"]
TokenDtype = Literal["uint16", "uint32"]
NonFinite = Literal["error", "skip"]
ActivationCheckpointing = Literal["none", "full", "selective", "auto"]
CeKernel = Literal["auto", "plain", "chunked", "liger", "triton"]
SwigluKernel = Literal["auto", "plain", "fused"]
OptimName = Literal["adamw", "sgd"]
Schedule = Literal["cosine", "linear", "constant"]
Policy = Literal["fp32", "bf16-mixed", "fp16-mixed", "bf16-true", "bf16-master"]
Float8 = Literal["none", "tensorwise", "rowwise"]
Scope = Literal["model", "model+loss", "step"]
CompileScope = Literal["step", "blocks"]
"""What an inference engine compiles (kiln.llm.block_compile): the whole prefill / decode step
(`step`: the most fusion, the longest compile) or each repeated block once for every layer
(`blocks`: the shortest warm-up)."""
CompileDefaults = Literal["measured", "torch"]
Strategy = Literal["none", "ddp", "fsdp", "auto"]
Backend = Literal["auto", "nccl", "gloo"]
CommHook = Literal["none", "bf16", "fp16"]
FsdpParamDtype = Literal["auto", "fp32", "bf16", "fp16"]
FsdpReduceDtype = Literal["fp32", "bf16", "fp16"]
CompileStrategy = Literal["auto", "whole", "per_block"]
CpuBind = Literal["none", "cores", "numa"]
Tracker = Literal["none", "mlflow", "wandb"]


@dataclass(kw_only=True)
class ModelConfig:
    name: str = "mlp"
    """Which model: a registry name (`mlp`, `vit`), `llama:<preset | config.json | dir>` (kiln's own Llama-family decoder, the one `kiln generate` runs), `timm:<name>`, `hf:<preset | config.json | dir>`, or a user factory `module:function` / `path/file.py:function`."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the model factory (e.g. `hidden_size`, `num_layers` for `mlp`; config.json fields such as `num_hidden_layers` for `hf:` and `llama:`)."""
    task: Task = "auto"
    """Loss to train with: `auto` (from the model), `classification` (cross-entropy), `causal_lm` (next-token), `custom` (the model returns its own loss)."""
    attention: Attention = "auto"
    """Attention kernel behind `scaled_dot_product_attention` while training: `auto` (torch picks per call), `flash`, `cudnn`, `efficient` (memory-efficient) or `math`; the kernel SDPA runs for the model's shapes is reported in the log and summary.json."""


@dataclass(kw_only=True)
class DataConfig:
    source: str = "synthetic"
    """Where batches come from: `synthetic`, `files` (.npy/.pt tensor pair), `tokens` (.bin memmap), `imagefolder` (needs torchvision), or a user `module:function`."""
    path: str = ""
    """Inputs file (`files`), token file or `kiln data prepare` directory (`tokens`: its train.bin, val.bin for eval, dtype from its meta.json), or image root (`imagefolder`)."""
    labels_path: str = ""
    """Targets file for `files` (same number of rows as `path`)."""
    eval_path: str = ""
    """Optional held-out inputs/tokens/images for the eval loop; empty uses a prepared `data.path`'s val.bin, a separate synthetic split, or none."""
    eval_labels_path: str = ""
    """Targets file for `eval_path` with `files`."""
    token_dtype: TokenDtype = "uint16"
    """Element type of a `tokens` .bin file: `uint16` or `uint32` (a prepared directory's meta.json overrides it)."""
    batch_size: int = 32
    """Samples per micro-batch on each device."""
    seq_len: int = 0
    """Sequence length for token data; 0 takes the model's default."""
    synthetic_samples: int = 4096
    """Size of the synthetic dataset (it is learnable: targets come from a fixed random teacher)."""
    num_workers: int = 2
    """DataLoader worker processes for file/user data (synthetic data is made on the device and needs none)."""
    pin_memory: bool = True
    """Pin host batches for faster, asynchronous copies to a CUDA device (ignored on CPU)."""
    prefetch_factor: int = 2
    """Batches each worker loads ahead."""
    shuffle: bool = True
    """Shuffle samples every epoch (seeded, so runs repeat)."""
    drop_last: bool = True
    """Drop the last incomplete batch of an epoch (keeps shapes static for compile)."""


@dataclass(kw_only=True)
class TrainingConfig:
    steps: int = 200
    """Optimizer steps to run."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    seed: int = 0
    """Seed for torch, numpy and python RNGs and for synthetic data."""
    deterministic: bool = False
    """Use deterministic algorithms (slower; needed for bitwise-repeatable runs)."""
    device: str = "auto"
    """`auto` (CUDA if present, else CPU), `cpu`, `cuda` or `cuda:N`."""
    log_interval: int = 10
    """Steps between metric logs; the host reads device values only at these steps."""
    eval_interval: int = 0
    """Steps between eval passes; 0 disables eval (an eval also runs at the end when > 0)."""
    eval_steps: int = 10
    """Batches per eval pass."""
    nonfinite: NonFinite = "error"
    """On a NaN/inf loss or gradient norm: `error` (stop, exit 1, keep the last good checkpoint) or `skip` (drop that update)."""
    nonfinite_max_skips: int = 10
    """With `skip`: stop after this many consecutive non-finite steps."""
    activation_checkpointing: ActivationCheckpointing = "none"
    """Recompute activations in backward instead of keeping them, per repeated block: `none`, `full` (keep only each block's input), `selective` (keep matmul and attention outputs, recompute the cheap elementwise ops: most of the memory saved for little extra time), or `auto`: the least recomputation the GPU memory plan fits (`none` where that plan reserves at most 75 % of each GPU and fits its free memory, else `selective`, else `full`; `none` on a CPU or where kiln makes no GPU plan). The mode chosen is logged and kept in summary.json (`features`)."""
    ce_kernel: CeKernel = "auto"
    """Next-token loss of `llama:` models: `plain` (logits, then cross-entropy), `chunked` (kiln's fused linear + cross-entropy over chunks of tokens: never holds [tokens x vocab] fp32 logits, exact gradients), `liger` (Liger-Kernel's fused linear cross-entropy, `pip install 'kiln[kernels]'`), `triton` (logits as `plain`, then kiln's Triton cross-entropy: one pass over the logits forward, one read and write backward, no fp32 copy; any causal LM), or `auto` (`chunked` for `llama:` models, `plain` for others)."""
    swiglu_kernel: SwigluKernel = "auto"
    """SwiGLU of `llama:` models: `plain` (PyTorch ops, fused by inductor when compiled), `fused` (kiln's Triton forward and backward kernels; the backward reads gate, up and its gradient once), or `auto` (`fused` on CUDA for `llama:` models, else `plain`)."""


@dataclass(kw_only=True)
class OptimConfig:
    name: OptimName = "adamw"
    """Optimizer: `adamw` (fused on CUDA) or `sgd`."""
    lr: float = 1e-3
    """Peak learning rate."""
    weight_decay: float = 0.01
    """Decoupled weight decay, applied to matrices and embeddings only (not to biases and norms)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    momentum: float = 0.9
    """SGD momentum."""
    fused: bool | None = None
    """Fused optimizer kernel: `auto` (on CUDA), `true`, `false`."""
    schedule: Schedule = "cosine"
    """LR schedule after warm-up: `cosine`, `linear` or `constant`."""
    warmup_steps: int = 0
    """Linear warm-up steps from 0 to `lr`."""
    min_lr_ratio: float = 0.1
    """Final LR as a fraction of `lr` for `cosine` and `linear`."""
    decay_steps: int = 0
    """Steps the warm-up + decay spans; 0 = `training.steps`. Past it the LR stays at its final value. Training a finished run longer (a higher `training.steps` in its run dir) keeps the run's span, so the extra steps continue at the LR the run ended with instead of jumping back up the curve."""


@dataclass(kw_only=True)
class PrecisionConfig:
    policy: Policy = "fp32"
    """`fp32`, `bf16-mixed` (autocast), `fp16-mixed` (autocast + GradScaler), `bf16-true` (weights in bf16), `bf16-master` (bf16 weights and gradients, fp32 master weights and AdamW moments in the optimizer: no autocast casts, clipping folded into a fused update; AdamW only, not with compile.cudagraphs, compile.scope=step; under FSDP2 each rank keeps the masters and moments of its own shard)."""
    tf32: bool = True
    """Allow TF32 tensor cores for fp32 matmuls and convolutions on CUDA."""
    float8: Float8 = "none"
    """float8 training of the repeated blocks' linear layers through torchao (`pip install 'kiln[quant]'`): `none`, `tensorwise` or `rowwise` scaling. Needs a CUDA GPU with float8 tensor cores (compute capability >= 8.9: Ada, Hopper) and a bf16 policy; pairs with `compile.enabled`."""


@dataclass(kw_only=True)
class CompileConfig:
    enabled: bool = False
    """Compile with torch.compile."""
    mode: str = ""
    """torch.compile mode (`default`, `reduce-overhead`, `max-autotune`, `max-autotune-no-cudagraphs`, ...); empty for torch's default. Exclusive with `options`."""
    backend: str = "inductor"
    """torch.compile backend; any name `torch._dynamo.list_backends(exclude_tags=())` lists."""
    options: dict[str, Any] = field(default_factory=dict)
    """Inductor options (keys of `torch._inductor.config`, e.g. `coordinate_descent_tuning`). Exclusive with `mode`."""
    fullgraph: bool = False
    """Fail on any graph break instead of falling back to eager around it."""
    dynamic: bool | None = None
    """Dynamic shapes: `auto` (torch decides after a recompile), `true`, `false`."""
    scope: Scope = "model"
    """What is compiled: `model`, `model+loss`, or `step` (forward, loss and optimizer update)."""
    regional: bool = False
    """Compile each repeated block (transformer layer) separately instead of the whole model: a compile several times faster (one block is compiled and reused); on launch-bound steps pair it with `cudagraphs`, since each region adds Python overhead per call."""
    cudagraphs: bool = False
    """Capture the whole optimizer step (forward, loss, backward, clipping, non-finite guard, optimizer update, LR schedule) in one CUDA graph and replay it every step; with `enabled` the compiled code is captured, without it the eager kernels. Needs one process on CUDA and a fixed batch shape; otherwise (or if capture fails, e.g. on a host sync) the normal step runs and the reason is logged."""
    defaults: CompileDefaults = "measured"
    """What `enabled=true` with no other compile key set means: `measured` (kiln's fastest accurate recipe for the model family on one CUDA GPU, as measured and published in docs/benchmarks.md; see kiln.train.compile_defaults) or `torch` (torch.compile's defaults)."""
    cache_dir: str = ""
    """Where compiled kernels are cached (inductor and Triton caches): empty for kiln's cache dir (`$KILN_CACHE_DIR` or `~/.cache/kiln/compile`), `torch` for torch's own default, or a path."""
    save_cache: bool = True
    """Save torch.compile's cache artifacts with the run (`compile_cache.bin`, torch >= 2.7) and load them on resume or restart, so a warm start skips most of the compile."""


@dataclass(kw_only=True)
class DistributedConfig:
    strategy: Strategy = "auto"
    """Data parallelism: `none` (one process), `ddp`, `fsdp` (FSDP2 fully_shard), or `auto` (one process: none; several: FSDP when parameters + gradients + optimizer state would not fit comfortably on one device, else DDP)."""
    backend: Backend = "auto"
    """Process-group backend: `auto` (NCCL on CUDA, gloo on CPU), `nccl`, `gloo`."""
    timeout_s: float = 600.0
    """Seconds a collective may wait before the group fails (a dead or cut-off peer ends in an error, not a hang)."""
    ddp_static_graph: bool = True
    """DDP: the set of used parameters never changes between steps (lets DDP skip per-step bookkeeping)."""
    ddp_gradient_as_bucket_view: bool = True
    """DDP: gradients are views into the all-reduce buckets (saves a copy and memory)."""
    ddp_bucket_cap_mb: float = 25.0
    """DDP: gradient bucket size in MiB."""
    ddp_broadcast_buffers: bool = False
    """DDP: re-broadcast buffers (e.g. BatchNorm stats) from rank 0 every forward."""
    ddp_find_unused_parameters: bool = False
    """DDP: search the graph for parameters without gradients every step (slow; only for models that need it)."""
    ddp_comm_hook: CommHook = "none"
    """DDP gradient compression: `none`, `bf16` or `fp16` (all-reduce in 16 bits, halving traffic)."""
    fsdp_param_dtype: FsdpParamDtype = "auto"
    """FSDP2 MixedPrecisionPolicy param dtype for compute: `auto` (from precision.policy), `fp32`, `bf16`, `fp16`."""
    fsdp_reduce_dtype: FsdpReduceDtype = "fp32"
    """FSDP2 MixedPrecisionPolicy dtype of the gradient reduce-scatter: `fp32`, `bf16`, `fp16`."""
    fsdp_wrap: str = "auto"
    """FSDP2 units: `auto` (the model's repeated blocks), `size` (modules with >= fsdp_min_params parameters), or comma-separated class names."""
    fsdp_min_params: int = 100_000_000
    """FSDP2 `size` rule: smallest parameter count of a module that becomes its own unit."""
    fsdp_unit_blocks: int = 0
    """FSDP2 with `fsdp_wrap=auto`: consecutive repeated blocks per FSDP unit (one all-gather and one reduce-scatter each). 0 = auto: units of equal block counts that each gather >= 64 MiB of parameters (ViT-B/16 in bf16: 2 units of 6 blocks). More blocks per unit: fewer, larger collectives and less per-unit host work every step, but coarser overlap and more gathered memory."""
    fsdp_reshard_after_forward: bool | None = None
    """FSDP2: `true` frees gathered parameters after forward (ZeRO-3, less memory), `false` keeps them until backward (ZeRO-2-like: one all-gather less per unit and step, less host work), `auto` keeps them when the whole model gathers <= 1 GiB (about 0.5 B parameters in bf16) or when the run's memory plan with them kept reserves at most 75 % of the GPU, else frees them (summary.json's `fsdp_layout` says which). The root and the last unit are never resharded: backward needs them first."""
    fsdp_forward_prefetch: int = 0
    """FSDP2: units whose all-gather each unit issues explicitly before its own forward (0 = FSDP2's implicit prefetch, which overlaps only while the CPU runs ahead of the device)."""
    replicate_degree: int = 1
    """FSDP2 as HSDP: `N` > 1 splits the ranks into N replicas of the model, each sharded over world size / N ranks (a 2-D device mesh `replicate` x `shard`; put one replica on each node, so the all-gathers and reduce-scatters stay on the node's fast links and only one gradient all-reduce per step crosses nodes). Needs distributed.strategy=fsdp and a world size divisible by N. 1 = plain FSDP2: shard over every rank."""
    fsdp_backward_prefetch: int = 0
    """FSDP2: units whose all-gather each unit issues explicitly before its own backward, in backward order (0 = FSDP2's default: the next unit, implicitly). Only with fsdp_reshard_after_forward resharding the units (else backward gathers nothing)."""
    fsdp_cpu_offload: bool = False
    """FSDP2: keep sharded parameters, gradients and optimizer state in CPU memory."""
    fsdp_local_update: bool = True
    """FSDP2: run the (elementwise) optimizer update on each rank's local shards as plain tensors instead of op by op through DTensor dispatch: the same arithmetic with far less host work per step (kiln.distributed.local_optim). `false`: torch's DTensor path."""
    fsdp_one_rank_fused_copy: bool = True
    """FSDP2 with one rank: fill each unit's gathered parameters (cast to the param dtype) with one fused copy instead of torch's cast and copy per parameter (kiln.distributed.fsdp_one_rank): the same values with far less host work per step. No effect with more ranks, with CPU offload, or on a torch whose code differs (kiln then logs why, once). `false`: torch's own copy."""
    compile_strategy: CompileStrategy = "auto"
    """How compile combines with the strategy: `auto` (whole model for DDP with graph splitting at buckets, per-block for FSDP2), `whole`, `per_block`."""
    bind_numa: bool = False
    """Bind each process to the CPU cores of the NUMA node nearest its GPU (read from NVML)."""


@dataclass(kw_only=True)
class CpuConfig:
    threads: int = 0
    """Intra-op threads of a CPU run (also the threads inductor's C++ kernels are built for): 0 = auto, `OMP_NUM_THREADS` if set, else the physical cores of the process's CPU affinity divided among the ranks on this node (never more threads than cores)."""
    bind: CpuBind = "none"
    """Pin each process of a CPU run: `none`, `cores` (each rank its own share of the physical cores), `numa` (each rank the cores of one NUMA node, or a share of them when ranks outnumber nodes); threads follow the pinned cores."""


@dataclass(kw_only=True)
class CheckpointConfig:
    interval: int = 0
    """Save every N optimizer steps; 0 saves only at the end (and on SIGTERM/SIGINT)."""
    resume: str = "auto"
    """`auto` (continue the run dir's run from its newest complete checkpoint when the config is the same; a run of another config there is refused), `never` (refuse a run dir that holds a run), or the path of a checkpoint directory to start from."""
    keep: int = 3
    """Number of newest complete checkpoints kept; older ones are deleted."""
    async_save: bool = False
    """Write checkpoints in the background (torch.distributed.checkpoint.async_save), overlapping training."""
    save_final: bool = True
    """Save a checkpoint when training finishes."""
    writer_threads: int = 8
    """Most threads (and files) each rank writes its share of a checkpoint with (DCP's FileSystemWriter `thread_count`; one per 256 MiB of the rank's tensors, so a small state stays one file); rank 0 checksums the files several at a time. More threads write faster where the disk has the bandwidth; the default is the measured best of 1, 4 and 8 (docs/benchmarks.md)."""


@dataclass(kw_only=True)
class MetricsConfig:
    console: bool = True
    """Show a live progress bar and log lines on the console."""
    jsonl: bool = True
    """Write `metrics.jsonl` in the run dir."""
    tensorboard: bool | None = None
    """Write TensorBoard events under `tb/`: `auto` (when tensorboard is installed), `true`, `false`."""
    mfu: bool = True
    """Count FLOPs once (torch.utils.flop_counter) and report model FLOPs utilisation."""
    peak_tflops: float = 0.0
    """Device peak TFLOP/s for MFU; 0 looks the GPU up in kiln's table."""
    gpu_health: bool = True
    """Sample each rank's GPU through NVML (utilisation, memory, temperature, power, SM clock, throttle reasons) in a background thread and log min/mean/max per interval; turns itself off with one info line without nvidia-ml-py or a GPU."""
    gpu_health_period_s: float = 1.0
    """Seconds between NVML samples (the sampler thread's period)."""
    sync_timing: bool = False
    """Time each rank's wait in gradient collectives (DDP: CUDA events or host clocks around the last bucket's all-reduce, read at log steps) and at the log-step gather; naming a straggler under DDP needs it. Off by default: it replaces DDP's built-in C++ all-reduce hook with a Python one, whose cost at scale is not measured yet."""
    straggler_margin: float = 0.2
    """A rank is slow in an interval when its own time per step (step time minus time blocked in collectives) exceeds the median of the other ranks by more than this fraction."""
    straggler_intervals: int = 3
    """Consecutive slow log intervals before a rank is named a straggler (warning and `stragglers` in the metrics)."""
    prometheus: bool = False
    """Serve the latest metrics as Prometheus text (`/metrics`) from rank 0 while training."""
    prometheus_host: str = "127.0.0.1"
    """Address the Prometheus endpoint binds to (loopback by default: not reachable from other machines)."""
    prometheus_port: int = 9464
    """Port of the Prometheus endpoint; 0 picks a free port (logged at start)."""
    tracker: Tracker = "none"
    """Experiment tracker that also gets the run's config and metrics (rank 0): `none`, `mlflow` (`MLFLOW_TRACKING_URI`, else the SQLite store RUN_DIR/mlflow.db; `pip install 'kiln[mlflow]'`) or `wandb` (its `WANDB_*` settings, `WANDB_MODE=offline` to stay local; `pip install 'kiln[wandb]'`)."""
    tracker_project: str = ""
    """The tracker's experiment (MLflow) or project (W&B); empty: `kiln`."""


@dataclass(kw_only=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model to train."""
    data: DataConfig = field(default_factory=DataConfig)
    """The data it trains on."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """Loop length, accumulation, clipping, seeds, device, intervals."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and learning-rate schedule."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Numeric precision policy."""
    compile: CompileConfig = field(default_factory=CompileConfig)
    """torch.compile settings."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Parallelism across processes."""
    cpu: CpuConfig = field(default_factory=CpuConfig)
    """Threads and core/NUMA pinning on a CPU run."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Saving and resuming."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """What is measured and where it goes."""


# Built-in data sources; anything else must look like `module:function`.
DATA_SOURCES = ("synthetic", "files", "tokens", "imagefolder")
