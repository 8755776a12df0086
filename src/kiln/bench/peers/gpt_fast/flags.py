"""gpt-fast's flags of `kiln bench llm`, checked before any work (kiln.bench.llm.llm_options calls it
while it builds the plan): the checkout, its quantizations, their group size, its time limits and
whether its Transformer can express the model."""

from __future__ import annotations

from typing import Any

from kiln.bench.peers.gpt_fast.process import QUANTS, check_checkout, model_args
from kiln.errors import ConfigError


def _positive(flag: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(flag, f"must be > 0, got {value}")


def check_flags(opts, config) -> dict[str, Any]:
    """The plan's gpt-fast fields for `opts` (kiln.bench.llm.llm_options.LlmBenchOptions) on a model of
    `config` (its DecoderConfig), checked; empty without --gpt-fast. ConfigError names the flag."""
    if not opts.gpt_fast:
        return {}
    root = check_checkout(opts.gpt_fast)
    quants = tuple(opts.gpt_fast_quants)
    bad = next((q for q in quants if q not in QUANTS), None) if quants else "(none given)"
    if bad is not None:
        raise ConfigError("--gpt-fast-quant", f"unknown gpt-fast quantization {bad!r}", QUANTS)
    _positive("--end-by-s", opts.end_by_s)
    _positive("--gpt-fast-timeout-s", opts.gpt_fast_timeout_s)
    group = opts.group_size or 128
    if "int4" in quants and group not in (32, 64, 128, 256):
        raise ConfigError("--group-size", f"gpt-fast's int4 takes group sizes 32, 64, 128, 256; got {group}")
    if config.vocab_size < 1024:
        raise ConfigError("--gpt-fast", f"gpt-fast's synthetic prompt draws ids below 1024; this model's vocabulary "
                          f"has {config.vocab_size}")
    try:
        model_args(config)
    except ValueError as exc:
        raise ConfigError("--gpt-fast", str(exc)) from None
    return {"gpt_fast": str(root.resolve()), "gpt_fast_quants": quants, "gpt_fast_group_size": group,
            "gpt_fast_timeout_s": opts.gpt_fast_timeout_s, "end_by_s": opts.end_by_s}
