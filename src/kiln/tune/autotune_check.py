"""`kiln autotune`'s checks (request: kiln.tune.autotune_request): the search space, budget and process
count a request asks for, or a ConfigError naming the flag (exit 2) before any work. An LLM
config (`model.name=llama:...`) searches the LLM knobs (kiln.tune.llm_search), any other the
compile recipes (kiln.tune.search)."""

from __future__ import annotations

import copy
import importlib.util

import torch

from kiln.bench.compile.recipes import PRECISIONS, split_values
from kiln.config import load_config
from kiln.config.schema import Config
from kiln.config.validate import compile_modes, validate_compile
from kiln.errors import ConfigError
from kiln.models import build_model
from kiln.precision import cpu_bf16_native, resolve_precision
from kiln.runtime import resolve_device
from kiln.train.float8 import check_float8
from kiln.tune import llm_space as sp
from kiln.tune.autotune_request import AutotuneRequest
from kiln.tune.llm_search import LlmTuneOptions, configure
from kiln.tune.search import TuneOptions
from kiln.tune.space import SCOPES, Space


def checked_list(flag: str, raw: str | None, valid: tuple[str, ...] | list[str] | None = None) -> list[str] | None:
    """A comma-separated flag's values (None when the flag was not given); ConfigError naming the
    flag for an empty list or a value outside `valid`."""
    if raw is None:
        return None
    values = split_values([raw])
    if not values:
        raise ConfigError(flag, "needs at least one value", valid)
    for value in values:
        if valid is not None and value not in valid:
            raise ConfigError(flag, f"unknown value {value!r}", valid)
    return values


def check_budget(req: AutotuneRequest) -> None:
    """--budget (> 0 minutes), --steps (>= 3) and --warmup (>= 0)."""
    if not req.budget > 0:
        raise ConfigError("--budget", f"must be > 0 minutes, got {req.budget}")
    for flag, value, minimum in (("--steps", req.steps, 3), ("--warmup", req.warmup, 0)):
        if value < minimum:
            raise ConfigError(flag, f"must be >= {minimum}, got {value}")


def autotune_config(req: AutotuneRequest) -> Config:
    """The config to tune: --config, the overrides, --device."""
    return load_config(req.config, list(req.overrides) + ([f"training.device={req.device}"] if req.device else []))


def is_llm(cfg: Config) -> bool:
    return cfg.model.name.startswith("llama:")


def plan_autotune(req: AutotuneRequest) -> tuple[TuneOptions, int | None, list[str]]:
    """(TuneOptions, nproc for the strategy stage, notes) for a compile-recipe search."""
    check_budget(req)
    cfg = autotune_config(req)
    notes = []
    if cfg.compile.options:
        notes.append("compile.options dropped: kiln autotune searches torch.compile modes (a mode and options "
                     "exclude each other)")
        cfg = copy.deepcopy(cfg)
        cfg.compile.options = {}
        if cfg.compile.enabled and not cfg.compile.mode:
            cfg.compile.mode = "default"
    device = resolve_device(cfg.training.device)
    gpu = device.type == "cuda"
    precisions = checked_list("--precisions", req.precisions, PRECISIONS)
    if precisions is None:  # bf16 where it runs natively: a GPU with bf16, a CPU with AMX / AVX512-BF16
        precisions = [cfg.precision.policy]
        native = torch.cuda.is_bf16_supported() if gpu else cpu_bf16_native()
        if native and "bf16-mixed" not in precisions:
            precisions.append("bf16-mixed")
    for precision in precisions:
        try:
            resolve_precision(precision, device)
        except ConfigError as exc:
            raise ConfigError("--precisions", str(exc).split(": ", 1)[-1], exc.choices) from None
    available = compile_modes()
    modes = checked_list("--modes", req.modes)
    if modes is None:
        wanted = ["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"] if gpu else [
            "default", "max-autotune-no-cudagraphs"]
        modes = [m for m in wanted if m in available]
    probe = copy.deepcopy(cfg)
    probe.compile.enabled, probe.compile.backend = True, "inductor"
    for mode in modes:
        probe.compile.mode = mode
        try:
            validate_compile(probe)
        except ConfigError as exc:  # named after the flag, with torch's list and the seed's typo hint
            raise ConfigError("--modes", str(exc).split(": ", 1)[-1].rsplit(" (valid: ", 1)[0], exc.choices) from None
    scopes = checked_list("--scopes", req.scopes, SCOPES) or list(SCOPES)
    nproc = req.nproc_per_node
    if nproc is not None and nproc < 1:
        raise ConfigError("--nproc-per-node", f"must be >= 1, got {nproc}")
    if nproc is None and gpu and torch.cuda.device_count() > 1:
        nproc = torch.cuda.device_count()
    if nproc is not None and gpu and nproc > torch.cuda.device_count():
        raise ConfigError("--nproc-per-node", f"{nproc} processes but {torch.cuda.device_count()} visible GPUs")
    space = Space(precisions=precisions, modes=modes, scopes=scopes, regional=not req.no_regional,
                  cudagraphs=not req.no_capture)
    opts = TuneOptions(cfg=cfg, space=space, budget_s=req.budget * 60, steps=req.steps, warmup=req.warmup,
                       rank_noisy=req.rank_noisy)
    return opts, (nproc if nproc and nproc > 1 else None), notes


def has_blocks(cfg: Config) -> bool:
    """Whether the model has repeated blocks (regional compile is searched only then): built on the
    meta device, or for real once when its factory cannot build there."""
    try:
        with torch.device("meta"):
            return bool(build_model(cfg.model).blocks)
    except ConfigError:
        raise
    except Exception:  # a factory that cannot build on meta: build it for real, once
        return bool(build_model(cfg.model).blocks)


def _values(flag: str, raw: str | None, valid: tuple[str, ...], default: list[str]) -> list[str]:
    return checked_list(flag, raw, valid) or default


def _float8_here(cfg: Config, device: torch.device) -> tuple[list[str], str | None]:
    try:
        check_float8("tensorwise", device, cfg.precision.policy)
    except ConfigError as exc:
        return ["none"], f"float8 not searched: {str(exc).split(': ', 1)[-1]}"
    return ["none", "tensorwise", "rowwise"], None


def precisions_here(cfg: Config, device: torch.device) -> tuple[list[str], str | None]:
    """bf16-mixed and bf16-master for a bf16 AdamW config on a GPU (what the policy needs, config
    validation checks the rest per candidate); bf16-mixed on a CPU with native bf16 (as `kiln env`
    and `kiln advise` find it pays there); else the config's own policy only."""
    if device.type != "cuda":
        if not cpu_bf16_native():
            return [], "precision policy not searched: this CPU has no native bf16 (AMX, AVX512-BF16): it is emulated"
        if cfg.precision.policy in ("fp32", "bf16-mixed"):  # bf16-master's fused update is a GPU kernel
            return ["bf16-mixed"], None
        return [], f"precision policy not searched: the config trains {cfg.precision.policy}"
    if cfg.precision.policy not in ("bf16-mixed", "bf16-master") or cfg.optim.name != "adamw":
        return [], (f"precision policy not searched: the config trains {cfg.precision.policy} with "
                    f"{cfg.optim.name}; bf16-master replaces bf16-mixed's AdamW")
    return ["bf16-mixed", "bf16-master"], None


def plan_autotune_llm(req: AutotuneRequest, cfg: Config) -> tuple[LlmTuneOptions, list[str]]:
    """(LlmTuneOptions, notes) for an LLM config."""
    check_budget(req)
    device = resolve_device(cfg.training.device)
    notes = []
    if req.batch_sizes is None:
        batches = sp.default_batches(cfg.data.batch_size)
    else:
        try:
            batches = sorted({int(b) for b in req.batch_sizes.split(",") if b.strip()})
        except ValueError:
            raise ConfigError("--batch-sizes", f"expected comma-separated integers, got {req.batch_sizes!r}") from None
        if not batches or batches[0] < 1:
            raise ConfigError("--batch-sizes", f"needs integers >= 1, got {req.batch_sizes!r}")
    float8_default, why = _float8_here(cfg, device)
    if why and req.float8 is None:
        notes.append(why)
    float8 = _values("--float8", req.float8, sp.FLOAT8, float8_default)
    precision_default, why = precisions_here(cfg, device)
    if why and req.precisions is None:
        notes.append(why)
    precision = _values("--precisions", req.precisions, sp.PRECISIONS, precision_default)
    ce_default = (["chunked", "plain"] + (["triton"] if device.type == "cuda" else [])
                  + (["liger"] if importlib.util.find_spec("liger_kernel") else []))
    space = sp.LlmSpace(batches=batches, ac=_values("--ac", req.ac, sp.AC_MODES, list(sp.AC_MODES)),
                        ce=_values("--ce-kernels", req.ce_kernels, sp.CE_KERNELS, ce_default), float8=float8,
                        compile=_values("--compile-scopes", req.compile_scopes, sp.COMPILE_SCOPES,
                                        ["regional", "whole"]), precision=precision)
    if not req.loss_tol > 0:
        raise ConfigError("--loss-tol", f"must be > 0, got {req.loss_tol}")
    configure(cfg, sp.from_config(cfg))  # the config's own settings as a candidate: a key kiln refuses exits here
    ignored = [flag for flag, value in (("--modes", req.modes),
                                        ("--scopes", req.scopes), ("--nproc-per-node", req.nproc_per_node),
                                        ("--rank-noisy", req.rank_noisy or None))
               if value is not None]
    if ignored:
        notes.append(f"{', '.join(ignored)} not used: an LLM config searches the LLM knobs")
    opts = LlmTuneOptions(cfg=cfg, space=space, budget_s=req.budget * 60, steps=req.steps, warmup=req.warmup,
                          loss_tol=req.loss_tol)
    return opts, notes
