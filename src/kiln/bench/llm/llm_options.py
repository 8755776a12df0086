"""`kiln bench llm`'s plan: the one check that turns the request into what the bench runs.

The request is kiln.bench.llm.llm_request.LlmBenchOptions (one field per flag). `check_options` is
the only place it is validated: it
resolves the preset, device, dtype and model, checks every value against what this torch, this
machine and this model allow, and returns an `LlmBenchPlan` the bench runs as it is. Every problem
is a ConfigError naming the flag (and the valid choices where there is a list), raised before any
model is built, so a bad request exits 2 without doing work.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from kiln.bench.llm.llm_engines import DEFAULT_ENGINES, ENGINES, PREFILL_MODES, TUNING
from kiln.bench.llm.llm_quant import load_ppl_tokens
from kiln.bench.llm.llm_request import LlmBenchOptions
from kiln.bench.peers.gpt_fast.flags import check_flags as gpt_fast_fields
from kiln.config.load import parse_literal
from kiln.config.validate import inductor_option_names
from kiln.errors import ConfigError
from kiln.generate.llm_checks import device_from_flag, dtype_from_flag, quant_specs
from kiln.llm import decode_attention, decode_matvec
from kiln.llm.config import preset_names, resolve_model
from kiln.llm.engine import check_lengths
from kiln.llm.quant import QuantSpec
from kiln.llm.weights import TORCH_DTYPES
from kiln.profile.decode import window_fits


@dataclass(frozen=True)
class LlmPreset:
    """A named model and request sizes; flags given beside `--preset` still apply."""

    name: str
    description: str
    model: str
    batch: int
    prompt_len: int
    new_tokens: int
    engines: tuple[str, ...] = DEFAULT_ENGINES


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
class LlmBenchPlan:
    """A checked request: every value resolved (preset, device, dtype, quant specs) and valid."""

    model: str
    """Preset, config.json or model directory (kiln.llm.config.resolve_model)."""
    engines: list[str] = field(default_factory=lambda: list(DEFAULT_ENGINES))
    """Engines to run, in order."""
    batches: tuple[int, ...] = (1,)
    """Batch sizes (prompts per request), in the order given; each engine runs once per batch."""
    prompt_len: int = DEFAULT_SIZES["prompt_len"]
    """Prompt tokens."""
    new_tokens: int = DEFAULT_SIZES["new_tokens"]
    """Tokens generated per request."""
    dtype: str = "bf16"
    """bf16, fp16 or fp32."""
    device: str = "cuda"
    """A torch device string."""
    warmup: int = LlmBenchOptions.warmup
    """Untimed generate calls after the first (compiling) one."""
    repeats: int = LlmBenchOptions.repeats
    """Timed generate rounds (every engine once per round)."""
    prefill_repeats: int = LlmBenchOptions.prefill_repeats
    """Timed prefills per engine."""
    seed: int = LlmBenchOptions.seed
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
    ppl_context: int = LlmBenchOptions.ppl_context
    """Perplexity window in tokens."""
    ppl_max_tokens: int | None = LlmBenchOptions.ppl_tokens
    """Score at most this many tokens of the perplexity file."""
    prefill: str = LlmBenchOptions.prefill
    """kiln-compiled's prefill: `compiled` (per padded length) or `eager` (no prefill compile)."""
    tuning: str = LlmBenchOptions.tuning
    """Where kiln-compiled uses coordinate-descent tuning: `full`, `decode` (prefill untuned) or `off`."""
    decode_attention: str = LlmBenchOptions.decode_attention
    """kiln engines' decode-step attention: `auto`, `matmul`, `flash` or `triton` (kiln.llm.decode_attention)."""
    decode_matvec: str = LlmBenchOptions.decode_matvec
    """kiln engines' decode-step projections: `auto` (`triton` where it runs), `inductor` or `triton`
    (kiln.llm.decode_matvec)."""
    deadline_s: float | None = None
    """No row starts its warm-up after this many seconds of the run (it is `skipped` instead)."""
    profile_decode: int = LlmBenchOptions.profile_decode
    """Decode steps of each kiln row to profile after timing (kiln.profile.decode); 0: none."""
    profile_dir: str | None = None
    """Where the decode profiles go (one folder per row); set from the output directory."""
    profile_prefill: int = LlmBenchOptions.profile_prefill
    """Prefills of each kiln row to profile after timing (kiln.profile.prefill); 0: none."""
    prefill_profile_dir: str | None = None
    """Where the prefill profiles go (one folder per row); set from the output directory."""
    gpt_fast: str | None = None
    """A gpt-fast checkout: its rows (kiln.bench.peers.gpt_fast) run after kiln's, on the same weights."""
    gpt_fast_quants: tuple[str, ...] = ("none", "int4")
    """gpt-fast rows: `none` and/or `int4`."""
    gpt_fast_group_size: int = 128
    """gpt-fast's int4 group size."""
    gpt_fast_timeout_s: float = LlmBenchOptions.gpt_fast_timeout_s
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
    engines = list(opts.engines) or list(preset.engines if preset else DEFAULT_ENGINES)
    _one_of("--engines", "engine", engines, ENGINES)
    if len(set(engines)) != len(engines):
        raise ConfigError("--engines", f"an engine is listed twice: {','.join(engines)}")
    sizes = {key: getattr(opts, key) if getattr(opts, key) is not None else
             (getattr(preset, key) if preset else default) for key, default in DEFAULT_SIZES.items()}
    batches = _batches(opts.batch, preset)
    minimums = {"--prompt-len": (sizes["prompt_len"], 1),
                "--new-tokens": (sizes["new_tokens"], 1), "--warmup": (opts.warmup, 0), "--repeats": (opts.repeats, 1),
                "--prefill-repeats": (opts.prefill_repeats, 1), "--ppl-context": (opts.ppl_context, 2),
                "--ppl-tokens": (opts.ppl_tokens, 2), "--profile-decode": (opts.profile_decode, 0),
                "--profile-prefill": (opts.profile_prefill, 0)}
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
    for flag, calls in (("--profile-decode", opts.profile_decode), ("--profile-prefill", opts.profile_prefill)):
        if calls and not kiln_rows:
            raise ConfigError(flag, "profiles kiln's engines; add kiln-eager, kiln-compiled or kiln-blocks to --engines")
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
                        profile_prefill=opts.profile_prefill,
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
