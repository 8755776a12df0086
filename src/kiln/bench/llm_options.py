"""What `kiln bench llm` is asked to do, and the one check that turns it into a plan.

`LlmBenchOptions` holds the request as the user gave it (each field is one flag; `auto`, None and
empty lists mean "the default"). `check_options` is the only place the request is validated: it
resolves the preset, device, dtype and model, checks every value against what this torch, this
machine and this model allow, and returns an `LlmBenchPlan` the bench runs as it is. Every problem
is a ConfigError naming the flag (and the valid choices where there is a list), raised before any
model is built, so a bad request exits 2 without doing work.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.bench.llm_engines import ENGINES, PREFILL_MODES, TUNING
from kiln.bench.llm_quant import load_ppl_tokens
from kiln.bench.peers.gpt_fast.check import check_flags as gpt_fast_fields
from kiln.config.errors import ConfigError
from kiln.config.load import parse_literal
from kiln.config.validate import inductor_option_names
from kiln.llm import decode_attention, decode_matvec
from kiln.llm.config import preset_names, resolve_model
from kiln.llm.engine import check_lengths
from kiln.llm.quant import QuantSpec, check_quant, parse_quant
from kiln.llm.weights import TORCH_DTYPES
from kiln.profile.decode import window_fits
from kiln.runtime import resolve_device

DTYPES = ("auto", "bf16", "fp16", "fp32")


@dataclass(frozen=True)
class LlmPreset:
    """A named model and request sizes; flags given beside `--preset` still apply."""

    name: str
    description: str
    model: str
    batch: int
    prompt_len: int
    new_tokens: int
    engines: tuple[str, ...] = ENGINES


PRESETS = {
    # The single-GPU inference comparison: Llama 3.2 3B at batch 1, a 1024-token prompt and 256 new
    # tokens, HF eager/compiled against kiln's engines.
    "seed002-llama3b": LlmPreset(
        name="seed002-llama3b",
        description="Llama-3.2-3B shape, bf16, batch 1, prompt 1024, 256 new tokens: HF eager/compiled vs kiln",
        model="llama-3.2-3b", batch=1, prompt_len=1024, new_tokens=256),
}
DEFAULT_SIZES = {"prompt_len": 1024, "new_tokens": 256}
MAX_BATCHES = 8
"""Batch sizes one run may measure (each is a row per engine, with its own warm-up)."""


@dataclass
class LlmBenchOptions:
    """`kiln bench llm`'s request, one field per flag, unchecked (check_options checks it)."""

    model: str | None = None
    """--model: a preset, config.json or model directory (kiln.llm.config.resolve_model); None takes the preset's."""
    preset: str | None = None
    """--preset: a name in PRESETS (its model, sizes and engines; fields given here still apply)."""
    engines: list[str] = field(default_factory=list)
    """--engines: engines in ENGINES, each once; empty takes the preset's or all of them."""
    batch: list[int] = field(default_factory=list)
    """--batch: batch sizes (prompts per request), one row per engine and batch; empty takes the preset's or 1."""
    prompt_len: int | None = None
    """--prompt-len: prompt tokens; None takes the preset's or 1024."""
    new_tokens: int | None = None
    """--new-tokens: tokens generated per request; None takes the preset's or 256."""
    device: str = "auto"
    """--device: auto (CUDA if present), cpu, cuda or cuda:N."""
    dtype: str = "auto"
    """--dtype: auto (bf16 on CUDA, fp32 elsewhere), bf16, fp16 or fp32."""
    warmup: int = 1
    """--warmup: untimed requests per engine after the first (compiling) one."""
    repeats: int = 3
    """--repeats: timed generate rounds (every engine once per round)."""
    prefill_repeats: int = 10
    """--prefill-repeats: timed prefills per engine."""
    seed: int = 0
    """--seed: seed of the prompt and of random weights."""
    inductor: list[str] = field(default_factory=list)
    """--inductor: KEY=VALUE inductor options for kiln-compiled, over kiln's defaults."""
    quants: list[str] = field(default_factory=list)
    """--quant: entries KIND or KIND@BACKEND, one kiln row each; empty means `none` only."""
    group_size: int | None = None
    """--group-size: input features per quantization scale; None takes each kind's default."""
    quant_backend: str = "torchao"
    """--quant-backend: the backend of entries that name none."""
    quant_lm_head: bool = True
    """--quant-lm-head: quantize the output head too."""
    ppl_file: str | None = None
    """--ppl-file: local text, token-id file or `kiln data prepare` directory for perplexity; None skips it."""
    ppl_context: int = 1024
    """--ppl-context: perplexity window in tokens."""
    ppl_tokens: int = 16384
    """--ppl-tokens: score at most this many tokens of the perplexity file."""
    prefill: str = "compiled"
    """--prefill: kiln-compiled's prefill, one of PREFILL_MODES."""
    tuning: str = "full"
    """--tuning: where kiln-compiled runs coordinate-descent tuning, one of TUNING."""
    decode_attention: str = "auto"
    """--decode-attention: kiln engines' decode-step attention (kiln.llm.decode_attention)."""
    decode_matvec: str = "auto"
    """--decode-matvec: kiln engines' decode-step projections (kiln.llm.decode_matvec)."""
    deadline_s: float | None = None
    """--deadline-s: no row starts its warm-up after this many seconds; None: no deadline."""
    profile_decode: int = 0
    """--profile-decode: decode steps of each kiln row to profile after timing; 0: none."""
    gpt_fast: str | None = None
    """--gpt-fast: a gpt-fast checkout whose rows run after kiln's on the same weights; None: no such rows."""
    gpt_fast_quants: list[str] = field(default_factory=lambda: ["none", "int4"])
    """--gpt-fast-quant: gpt-fast rows, entries in gpt-fast's QUANTS."""
    gpt_fast_timeout_s: float = 600.0
    """--gpt-fast-timeout-s: seconds all gpt-fast rows together may take."""
    end_by_s: float | None = None
    """--end-by-s: gpt-fast rows end by this many seconds after the bench started; None: no limit."""
    out: str | None = None
    """--out: output directory; None: runs/<time>-bench-llm-<name>."""


@dataclass
class LlmBenchPlan:
    """A checked request: every value resolved (preset, device, dtype, quant specs) and valid."""

    model: str
    """Preset, config.json or model directory (kiln.llm.config.resolve_model)."""
    engines: list[str] = field(default_factory=lambda: list(ENGINES))
    """Engines to run, in order."""
    batches: tuple[int, ...] = (1,)
    """Batch sizes (prompts per request), in the order given; each engine runs once per batch."""
    prompt_len: int = 1024
    """Prompt tokens."""
    new_tokens: int = 256
    """Tokens generated per request."""
    dtype: str = "bf16"
    """bf16, fp16 or fp32."""
    device: str = "cuda"
    """A torch device string."""
    warmup: int = 1
    """Untimed generate calls after the first (compiling) one."""
    repeats: int = 3
    """Timed generate rounds (every engine once per round)."""
    prefill_repeats: int = 10
    """Timed prefills per engine."""
    seed: int = 0
    """Seed of the prompt and of random weights."""
    preset: str | None = None
    """The preset's name, if one was used."""
    inductor_options: dict[str, Any] = field(default_factory=dict)
    """Inductor options for kiln-compiled, over kiln's defaults."""
    quants: dict[str, QuantSpec] = field(default_factory=lambda: {"none": QuantSpec()})
    """`--quant` entry (`int4`, `int4@inductor`, ...) -> checked spec (kiln.llm.quant.check_quant); each
    kiln engine runs once per entry."""
    ppl_file: str | None = None
    """Local text (or token-id) file for perplexity; None skips perplexity."""
    ppl_context: int = 1024
    """Perplexity window in tokens."""
    ppl_max_tokens: int | None = 16384
    """Score at most this many tokens of the perplexity file."""
    prefill: str = "compiled"
    """kiln-compiled's prefill: `compiled` (per padded length) or `eager` (no prefill compile)."""
    tuning: str = "full"
    """Where kiln-compiled uses coordinate-descent tuning: `full`, `decode` (prefill untuned) or `off`."""
    decode_attention: str = "auto"
    """kiln engines' decode-step attention: `auto`, `matmul`, `flash` or `triton` (kiln.llm.decode_attention)."""
    decode_matvec: str = "auto"
    """kiln engines' decode-step projections: `auto` (`triton` where it runs), `inductor` or `triton`
    (kiln.llm.decode_matvec)."""
    deadline_s: float | None = None
    """No row starts its warm-up after this many seconds of the run (it is `skipped` instead)."""
    profile_decode: int = 0
    """Decode steps of each kiln row to profile after timing (kiln.profile.decode); 0: none."""
    profile_dir: str | None = None
    """Where the decode profiles go (one folder per row); set from the output directory."""
    gpt_fast: str | None = None
    """A gpt-fast checkout: its rows (kiln.bench.peers.gpt_fast) run after kiln's, on the same weights."""
    gpt_fast_quants: tuple[str, ...] = ("none", "int4")
    """gpt-fast rows: `none` and/or `int4`."""
    gpt_fast_group_size: int = 128
    """gpt-fast's int4 group size."""
    gpt_fast_timeout_s: float = 600.0
    """Seconds all gpt-fast rows together may take (conversion excluded)."""
    end_by_s: float | None = None
    """The gpt-fast rows end by this many seconds after the bench started (a time-boxed run)."""


def check_options(opts: LlmBenchOptions) -> LlmBenchPlan:
    """The plan `opts` asks for; ConfigError naming the flag at fault (and its valid values) otherwise.

    Checks run cheapest first; the model's config is read (no weights) for the checks that depend
    on its shape, and the perplexity file is read so that a bad one fails here, before any model."""
    preset = _preset(opts.preset)
    model = opts.model or (preset.model if preset else None)
    if not model:
        raise ConfigError("--model", "give a model (a preset, config.json or model directory) or --preset",
                          preset_names())
    engines = list(opts.engines) or list(preset.engines if preset else ENGINES)
    _one_of("--engines", "engine", engines, ENGINES)
    if len(set(engines)) != len(engines):
        raise ConfigError("--engines", f"an engine is listed twice: {','.join(engines)}")
    sizes = {key: getattr(opts, key) if getattr(opts, key) is not None else
             (getattr(preset, key) if preset else default) for key, default in DEFAULT_SIZES.items()}
    batches = _batches(opts.batch, preset)
    minimums = {"--prompt-len": (sizes["prompt_len"], 1),
                "--new-tokens": (sizes["new_tokens"], 1), "--warmup": (opts.warmup, 0), "--repeats": (opts.repeats, 1),
                "--prefill-repeats": (opts.prefill_repeats, 1), "--ppl-context": (opts.ppl_context, 2),
                "--ppl-tokens": (opts.ppl_tokens, 2), "--profile-decode": (opts.profile_decode, 0)}
    for flag, (value, minimum) in minimums.items():
        if value < minimum:
            raise ConfigError(flag, f"must be >= {minimum}, got {value}")
    _one_of("--prefill", "prefill mode", [opts.prefill], PREFILL_MODES)
    _one_of("--tuning", "tuning", [opts.tuning], TUNING)
    kiln_rows = any(e.startswith("kiln") for e in engines)
    if opts.profile_decode:
        fits = window_fits(sizes["new_tokens"])
        if opts.profile_decode > fits:
            raise ConfigError("--profile-decode", f"{opts.profile_decode} steps do not fit in a request of "
                              f"{sizes['new_tokens']} new tokens (at most {fits}: the window follows the graph's "
                              "warm-up steps within one request); raise --new-tokens or profile fewer steps")
        if not kiln_rows:
            raise ConfigError("--profile-decode", "profiles kiln's engines; add kiln-eager or kiln-compiled to --engines")
    _positive("--deadline-s", opts.deadline_s)
    device = device_from_flag(opts.device)
    dtype = dtype_from_flag(opts.dtype, device)
    source = resolve_model(model)
    config = source.config
    decode_attention.check(opts.decode_attention, device, TORCH_DTYPES[dtype], config.head_dim,
                           key="--decode-attention")
    decode_matvec.check(opts.decode_matvec, device, TORCH_DTYPES[dtype], key="--decode-matvec")
    check_lengths([sizes["prompt_len"]], sizes["new_tokens"], max_positions=config.max_positions, max_seq_len=None,
                  keys={"max_new_tokens": "--new-tokens", "prompt": "--prompt-len"})
    entries = list(opts.quants) or ["none"]
    defaults = QuantSpec(group_size=opts.group_size, backend=opts.quant_backend, lm_head=opts.quant_lm_head)
    quants = quant_specs(entries, defaults, config, device, dtype)
    if entries != ["none"] and not kiln_rows:
        raise ConfigError("--quant", "quantization applies to kiln's engines (HF rows stay unquantized references); "
                          "add kiln-eager or kiln-compiled to --engines")
    load_ppl_tokens(opts.ppl_file, source, config.vocab_size)
    return LlmBenchPlan(model=model, engines=engines, dtype=dtype, device=str(device), warmup=opts.warmup,
                        repeats=opts.repeats, prefill_repeats=opts.prefill_repeats, seed=opts.seed,
                        preset=preset.name if preset else None, inductor_options=_inductor_options(opts.inductor),
                        quants=quants, ppl_file=opts.ppl_file, ppl_context=opts.ppl_context,
                        ppl_max_tokens=opts.ppl_tokens, prefill=opts.prefill, tuning=opts.tuning,
                        decode_attention=opts.decode_attention, decode_matvec=opts.decode_matvec,
                        deadline_s=opts.deadline_s, profile_decode=opts.profile_decode,
                        batches=batches, **gpt_fast_fields(opts, config), **sizes)


def _batches(given: list[int], preset: LlmPreset | None) -> tuple[int, ...]:
    """--batch's sizes (the preset's or 1 when none is given); each >= 1, none twice, at most MAX_BATCHES."""
    batches = tuple(given) or ((preset.batch,) if preset else (1,))
    bad = next((b for b in batches if isinstance(b, bool) or not isinstance(b, int) or b < 1), None)
    if bad is not None:
        raise ConfigError("--batch", f"batch sizes must be integers >= 1, got {bad!r}")
    if len(set(batches)) != len(batches):
        raise ConfigError("--batch", f"a batch size is listed twice: {','.join(map(str, batches))}")
    if len(batches) > MAX_BATCHES:
        raise ConfigError("--batch", f"at most {MAX_BATCHES} batch sizes in one run, got {len(batches)}")
    return batches


def _preset(name: str | None) -> LlmPreset | None:
    if name is None:
        return None
    if name not in PRESETS:
        raise ConfigError("--preset", f"unknown preset {name!r}", tuple(PRESETS))
    return PRESETS[name]


def _one_of(flag: str, what: str, values: list[str], choices: tuple[str, ...]) -> None:
    bad = [v for v in values if v not in choices]
    if bad:
        raise ConfigError(flag, f"unknown {what} {bad[0]!r}", choices)


def _positive(flag: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(flag, f"must be > 0, got {value}")


def device_from_flag(spec: str) -> torch.device:
    """torch.device for --device; a typo or an absent GPU is a ConfigError naming --device."""
    choices = ("auto", "cpu", "cuda", "cuda:N")
    try:
        torch.device(spec if spec != "auto" else "cpu")
    except RuntimeError:
        raise ConfigError("--device", f"not a device: {spec!r}", choices) from None
    try:
        return resolve_device(spec)
    except ConfigError as exc:
        raise ConfigError("--device", exc.message, exc.choices) from None


def dtype_from_flag(spec: str, device: torch.device) -> str:
    """bf16/fp16/fp32 for --dtype (auto: bf16 on CUDA, fp32 elsewhere)."""
    if spec not in DTYPES:
        raise ConfigError("--dtype", f"unknown dtype {spec!r}", DTYPES)
    if spec == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return spec


def quant_specs(entries: list[str], defaults: QuantSpec, config, device: torch.device,
                dtype: str) -> dict[str, QuantSpec]:
    """--quant entry (`KIND` or `KIND@BACKEND`, over `defaults` from --group-size, --quant-backend and
    --quant-lm-head) -> checked QuantSpec; two entries may not be one quantization."""
    if len(set(entries)) != len(entries):
        raise ConfigError("--quant", f"a quantization is listed twice: {','.join(entries)}")
    specs = {e: check_quant(parse_quant(e, defaults), config, device, TORCH_DTYPES[dtype]) for e in entries}
    seen: dict[tuple, str] = {}
    for entry, spec in specs.items():
        twin = seen.setdefault((spec.kind, spec.library), entry)
        if twin != entry:
            raise ConfigError("--quant", f"{twin!r} and {entry!r} are the same quantization")
    return specs


def _inductor_options(assignments: list[str]) -> dict[str, object]:
    """--inductor KEY=VALUE entries -> options; a key this torch's inductor lacks names its close matches."""
    options: dict[str, object] = {}
    names = inductor_option_names() if assignments else []
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--inductor", f"expected KEY=VALUE, got {assignment!r}")
        key = key.strip()
        if key not in names:
            close = difflib.get_close_matches(key, names, n=3)
            raise ConfigError("--inductor", f"{key!r} is not an inductor option in this torch", close or None)
        options[key] = parse_literal(value)
    return options
