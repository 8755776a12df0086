"""The one place that checks a resolved Config; every failure is a ConfigError naming the key."""

from __future__ import annotations

import dataclasses
import math
import re

from kiln.config.choices import field_choices, switch_keys
from kiln.config.schema import DATA_SOURCES, Config
from kiln.errors import ConfigError

# Modes the seeds (and older blog posts) use that torch never had, with where to go instead.
_MODE_HINTS = {
    "max-performance": "max-autotune",
    "max_performance": "max-autotune",
    "max_autotune": "max-autotune",
    "reduce_overhead": "reduce-overhead",
}
# Backends removed from PyTorch that users still copy from old articles.
_REMOVED_BACKENDS = {"nvfuser": "inductor", "aot_ts_nvfuser": "inductor", "aot_nvfuser": "inductor"}

# fullmatch, not `$`: `$` also matches before a trailing newline, which let "pkg.mod:fn\n" through.
_IMPORT_PATH = re.compile(r"[\w./\\-]+(\.py)?:[A-Za-z_]\w*")

MAX_STEPS = 1_000_000_000
"""The most optimizer steps a run may have: far beyond any real run, well inside 64-bit counters."""


def is_import_path(text: str) -> bool:
    """`package.module:function` or `path/to/file.py:function`."""
    return bool(_IMPORT_PATH.fullmatch(text))


def _get(cfg: Config, key: str):
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def _at_least(cfg: Config, key: str, minimum: float) -> None:
    value = _get(cfg, key)
    if value < minimum:
        raise ConfigError(key, f"must be >= {minimum:g}, got {value!r}")


def compile_modes() -> list[str]:
    import torch._inductor

    return sorted(torch._inductor.list_mode_options())


def compile_backends() -> list[str]:
    import torch._dynamo

    return sorted(torch._dynamo.list_backends(exclude_tags=()))


def inductor_option_names() -> list[str]:
    import torch._inductor.config as inductor_config

    return sorted(k for k in inductor_config.get_config_copy() if not k.startswith("_"))


def validate_compile(cfg: Config) -> None:
    """Check compile settings against the installed torch (modes, backends and options change)."""
    c = cfg.compile
    if c.mode:
        modes = compile_modes()
        if c.mode in _MODE_HINTS:
            raise ConfigError(
                "compile.mode",
                f"{c.mode!r} is not a torch.compile mode; use {_MODE_HINTS[c.mode]!r} for the most optimisation",
                modes,
            )
        if c.mode not in modes:
            raise ConfigError("compile.mode", f"unknown mode {c.mode!r}", modes)
    if c.mode and c.options:
        raise ConfigError(
            "compile.options",
            "torch.compile takes either a mode or options, not both; put the mode's settings into options or drop them",
        )
    # torch's backend list needs torch._dynamo (seconds to import: every `kiln` process loads a
    # config, a launcher and each rank too), so it is read only for a backend other than
    # torch.compile's own default, which every torch kiln supports has.
    if c.backend in _REMOVED_BACKENDS:
        raise ConfigError(
            "compile.backend",
            f"{c.backend!r} was removed from PyTorch; use {_REMOVED_BACKENDS[c.backend]!r}",
            compile_backends(),
        )
    if c.backend != "inductor" and c.backend not in (backends := compile_backends()):
        raise ConfigError("compile.backend", f"unknown backend {c.backend!r}", backends)
    if c.options:
        if c.backend != "inductor":
            raise ConfigError("compile.options", f"options are inductor settings; backend is {c.backend!r}")
        names = inductor_option_names()
        known = set(names)
        for name, value in c.options.items():
            key = name
            if name not in known and isinstance(value, dict) and value:
                # TOML reads `[compile.options]  triton.cudagraphs = true` as a nested table, but
                # inductor's option names are flat dotted strings (torch._inductor.config.patch).
                dotted = [f"{name}.{sub}" for sub in value]
                unknown = [d for d in dotted if d not in known]
                if not unknown:
                    raise ConfigError(
                        f"compile.options.{name}",
                        f'inductor option names are dotted strings: quote them in TOML ("{dotted[0]}" = ...) '
                        f"or write compile.options.{dotted[0]}=... on the command line",
                    )
                key = unknown[0]
            if key not in known:
                import difflib

                close = difflib.get_close_matches(key, names, n=5, cutoff=0.6)
                raise ConfigError(f"compile.options.{key}", "not an inductor option in this torch", close or None)
    if c.mode and c.backend != "inductor" and c.mode != "default":
        raise ConfigError("compile.mode", f"modes are inductor settings; backend is {c.backend!r}", ["default"])
    if c.fullgraph and c.scope == "step":
        raise ConfigError(
            "compile.fullgraph",
            "scope 'step' breaks the graph at backward(); use scope 'model' or 'model+loss' with fullgraph",
        )
    if c.regional and c.scope != "model":
        raise ConfigError("compile.regional", "regional compilation compiles blocks of the model; needs compile.scope=model")


def _check_finite(cfg: Config) -> None:
    """NaN compares false with everything, so it would pass every range check below; inf would
    pass the lower bounds. Neither is a usable learning rate, clip norm, epsilon, ..."""
    for section in dataclasses.fields(cfg):
        obj = getattr(cfg, section.name)
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{section.name}.{f.name}", f"must be a finite number, got {value!r}")


def _check_master_weights(cfg: Config) -> None:
    """`precision.policy=bf16-master` runs its own eager AdamW over fp32 masters
    (kiln.train.master_adamw): what replaces or records that update is refused up front."""
    if cfg.precision.policy != "bf16-master":
        return
    other = ("bf16-mixed", "bf16-true")
    if cfg.optim.name != "adamw":
        raise ConfigError("precision.policy", f"bf16-master keeps fp32 masters in its AdamW; optim.name is "
                          f"{cfg.optim.name!r} (use optim.name=adamw)", other)
    if cfg.compile.enabled and cfg.compile.cudagraphs:
        raise ConfigError("precision.policy", "bf16-master's update runs eagerly (host-side LR and bias "
                          "corrections), so compile.cudagraphs=true cannot record it; turn one of them off", other)
    if cfg.compile.enabled and cfg.compile.scope == "step":
        raise ConfigError("precision.policy", "bf16-master's update is its own fused kernel, not traced by "
                          "torch.compile: use compile.scope=model or model+loss", other)
    if cfg.distributed.strategy == "fsdp" and cfg.distributed.fsdp_param_dtype not in ("auto", "bf16"):
        raise ConfigError("distributed.fsdp_param_dtype", "bf16-master keeps bf16 parameters (fp32 masters live in "
                          f"the optimizer); FSDP2 gathering them as {cfg.distributed.fsdp_param_dtype} would compute "
                          "in another dtype", ("auto", "bf16"))


def _check_choices(cfg: Config) -> None:
    """Each `Literal` field holds one of its values, each switch (`bool | None`) a bool or None."""
    switches = switch_keys()
    for key, allowed in field_choices().items():
        value = _get(cfg, key)
        ok = (value is None or isinstance(value, bool)) if key in switches else value in allowed
        if not ok:
            raise ConfigError(key, f"unknown value {value!r}", allowed)


def validate(cfg: Config, *, check_torch: bool = True) -> None:
    _check_finite(cfg)
    _check_choices(cfg)

    if not cfg.model.name.strip():
        raise ConfigError("model.name", "must not be empty")
    src = cfg.data.source
    if src not in DATA_SOURCES and not is_import_path(src):
        raise ConfigError("data.source", f"unknown source {src!r}", (*DATA_SOURCES, "module:function"))
    if src in ("files", "tokens", "imagefolder") and not cfg.data.path:
        raise ConfigError("data.path", f"data.source={src} needs a path")
    if src == "files" and not cfg.data.labels_path:
        raise ConfigError("data.labels_path", "data.source=files needs a targets file")

    for key, minimum in (
        ("data.batch_size", 1),
        ("data.seq_len", 0),
        ("data.synthetic_samples", 1),
        ("data.num_workers", 0),
        ("data.prefetch_factor", 1),
        ("training.steps", 1),
        ("training.grad_accum_steps", 1),
        ("training.grad_clip", 0),
        ("training.log_interval", 1),
        ("training.eval_interval", 0),
        ("training.eval_steps", 1),
        ("optim.lr", 0),
        ("optim.weight_decay", 0),
        ("optim.eps", 0),
        ("optim.momentum", 0),
        ("optim.warmup_steps", 0),
        ("optim.min_lr_ratio", 0),
        ("optim.decay_steps", 0),
        ("metrics.peak_tflops", 0),
        ("training.nonfinite_max_skips", 1),
        ("distributed.ddp_bucket_cap_mb", 1e-3),
        ("distributed.fsdp_min_params", 1),
        ("distributed.fsdp_unit_blocks", 0),
        ("distributed.fsdp_forward_prefetch", 0),
        ("distributed.fsdp_backward_prefetch", 0),
        ("distributed.replicate_degree", 1),
        ("checkpoint.interval", 0),
        ("checkpoint.keep", 1),
        ("checkpoint.writer_threads", 1),
        ("metrics.straggler_margin", 0),
        ("metrics.straggler_intervals", 1),
        ("metrics.prometheus_port", 0),
        ("cpu.threads", 0),
    ):
        _at_least(cfg, key, minimum)
    if cfg.training.steps > MAX_STEPS:
        raise ConfigError("training.steps", f"{cfg.training.steps} is more steps than kiln runs (at most {MAX_STEPS:_}; "
                          "step numbers name checkpoint directories and count samples)")
    if not cfg.distributed.timeout_s > 0:
        raise ConfigError("distributed.timeout_s", f"must be > 0, got {cfg.distributed.timeout_s!r}")
    if not cfg.metrics.gpu_health_period_s > 0:
        raise ConfigError("metrics.gpu_health_period_s", f"must be > 0, got {cfg.metrics.gpu_health_period_s!r}")
    if cfg.metrics.prometheus_port > 65535:
        raise ConfigError("metrics.prometheus_port", f"must be a TCP port (0..65535), got {cfg.metrics.prometheus_port!r}")
    if cfg.optim.lr <= 0:
        raise ConfigError("optim.lr", f"must be > 0, got {cfg.optim.lr!r}")
    if cfg.optim.min_lr_ratio > 1:
        raise ConfigError("optim.min_lr_ratio", f"must be between 0 and 1, got {cfg.optim.min_lr_ratio!r}")
    if len(cfg.optim.betas) != 2 or not all(0 <= b < 1 for b in cfg.optim.betas):
        raise ConfigError("optim.betas", f"must be two numbers in [0, 1), got {cfg.optim.betas!r}")
    if cfg.optim.warmup_steps > (cfg.optim.decay_steps or cfg.training.steps):
        raise ConfigError(
            "optim.warmup_steps",
            f"warm-up ({cfg.optim.warmup_steps}) is longer than the schedule "
            f"({'optim.decay_steps' if cfg.optim.decay_steps else 'training.steps'}: "
            f"{cfg.optim.decay_steps or cfg.training.steps})",
        )
    _check_master_weights(cfg)
    if cfg.distributed.replicate_degree > 1 and cfg.distributed.strategy != "fsdp":
        raise ConfigError("distributed.replicate_degree", f"HSDP (replicas of FSDP2 shards) needs "
                          f"distributed.strategy=fsdp; it is {cfg.distributed.strategy!r}", ("1",))
    dev = cfg.training.device
    if not (dev in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:[0-9]+", dev)):
        raise ConfigError("training.device", f"unknown device {dev!r}", ("auto", "cpu", "cuda", "cuda:N"))
    if check_torch:
        # Checked even while compile is off: a typo should not wait for the day it is switched on.
        validate_compile(cfg)
