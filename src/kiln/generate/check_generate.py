"""`kiln generate`'s check: every flag, the model source, the tokenizer and the prompt lengths,
before any model is built. Each problem is a ConfigError naming the flag (exit 2)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kiln.data.special_tokens import agrees, special_tokens
from kiln.errors import ConfigError
from kiln.generate.llm_checks import at_least, checked_source, device_from_flag, dtype_from_flag, one_quant, parse_ids
from kiln.generate.request import GenerateOptions
from kiln.llm.config import ModelSource
from kiln.llm.engine import MAX_STOP_TOKENS, check_lengths
from kiln.llm.quant import QuantSpec
from kiln.llm.sampling import Sampling, check_sampling
from kiln.llm.tokenizer import Tokenizer, find_tokenizer, generation_stop_tokens, load_tokenizer
from kiln.llm.weights import TORCH_DTYPES
from kiln.models.host_memory import check_generation_fits
from kiln.outputs import check_writable_file

SAMPLING_FLAGS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p"}


@dataclass
class GenerateRequest:
    """A checked `kiln generate`: every value resolved and valid."""

    opts: GenerateOptions
    source: ModelSource
    device: torch.device
    dtype: str
    prompts: list[list[int]]
    texts: list[str] | None
    tokenizer: Tokenizer | None
    stop_tokens: list[int]
    sampling: Sampling
    compile: bool
    quant: QuantSpec


def _prompts(opts: GenerateOptions, tokenizer_dir: Path | None) -> tuple[list[list[int]], list[str] | None, object]:
    given = [flag for flag, value in (("--prompt", opts.prompt), ("--prompt-file", opts.prompt_file),
                                      ("--tokens", opts.tokens)) if value]
    if len(given) != 1:
        raise ConfigError("--prompt", f"give exactly one of --prompt, --prompt-file, --tokens (got {given or 'none'})")
    tokenizer = None
    if opts.tokenizer or (tokenizer_dir is not None and not opts.tokens):
        where = Path(opts.tokenizer) if opts.tokenizer else tokenizer_dir
        tokenizer = load_tokenizer(where, "--tokenizer" if opts.tokenizer else "--model")
    if opts.tokens:
        return [parse_ids(t, "--tokens") for t in opts.tokens], None, tokenizer
    if opts.prompt_file:
        path = Path(opts.prompt_file)
        try:
            texts = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except OSError as exc:
            raise ConfigError("--prompt-file", f"cannot read {path}: {exc}") from None
        if not texts:
            raise ConfigError("--prompt-file", f"{path} has no prompts (one per line)")
    else:
        texts = list(opts.prompt)
    if tokenizer is None:
        raise ConfigError("--prompt", "text prompts need a tokenizer: the model has no tokenizer.json; "
                          "pass --tokenizer DIR, or token ids with --tokens")
    return [tokenizer.encode(t) for t in texts], texts, tokenizer


def _check_tokenizer_eos(directory: Path, stops: list[int], key: str) -> None:
    """The model's stop tokens must include its tokenizer's end-of-text: otherwise generation runs past
    the real end, or stops at an ordinary token (an export whose config kept a preset's ids)."""
    eos = special_tokens(directory).get("eos_token_id")
    if eos is not None and not agrees(stops, eos[1]):
        raise ConfigError(key, f"{directory}: the tokenizer ends text with {eos[0]!r} (id {eos[1]}) but the model "
                          f"stops at {stops or 'nothing'} (generation_config.json / config.json eos_token_id); "
                          f"re-export the run (`kiln export RUN_DIR --out DIR --force` takes the tokenizer's ids), "
                          f"or pass --stop-tokens {eos[1]}")


def check_generate(opts: GenerateOptions) -> GenerateRequest:
    """The request `opts` asks for; ConfigError naming the flag at fault otherwise (before any model)."""
    at_least("--max-new-tokens", opts.max_new_tokens, 1)
    if opts.json:
        check_writable_file(opts.json, "--json")
    at_least("--max-seq-len", opts.max_seq_len, 2)
    sampling = check_sampling(Sampling(opts.temperature, opts.top_k, opts.top_p), SAMPLING_FLAGS)
    device = device_from_flag(opts.device)
    dtype = dtype_from_flag(opts.dtype, device)
    source = checked_source(opts.model, random_weights=opts.random_weights, device=device, dtype=dtype,
                            attention=opts.decode_attention, matvec=opts.decode_matvec, purpose="generate")
    config = source.config
    tokenizer_dir = source.directory if find_tokenizer(source.directory) else None
    prompts, texts, tokenizer = _prompts(opts, tokenizer_dir)
    check_lengths([len(p) for p in prompts], opts.max_new_tokens, max_positions=config.max_positions,
                  max_seq_len=opts.max_seq_len,
                  keys={"max_new_tokens": "--max-new-tokens", "max_seq_len": "--max-seq-len", "prompt": "--prompt"})
    bad = next((t for p in prompts for t in p if not 0 <= t < config.vocab_size), None)
    if bad is not None:
        raise ConfigError("--tokens", f"token id {bad} is outside the model's vocabulary [0, {config.vocab_size})")
    if opts.ignore_eos:
        stops = []
    elif opts.stop_tokens is not None:
        stops = parse_ids(opts.stop_tokens, "--stop-tokens")
    else:
        stops = generation_stop_tokens(source.directory, config.eos_token_ids)
        if tokenizer is not None:
            _check_tokenizer_eos(tokenizer.path.parent, stops, "--tokenizer" if opts.tokenizer else "--model")
    if len(set(stops)) > MAX_STOP_TOKENS:
        raise ConfigError("--stop-tokens", f"at most {MAX_STOP_TOKENS} stop tokens, got {len(set(stops))}")
    if device.type == "cpu":  # before the model is built: an 8B in fp32 would meet the OOM killer
        longest = max(len(p) for p in prompts) + opts.max_new_tokens
        check_generation_fits(config, dtype=dtype, dtype_bytes=TORCH_DTYPES[dtype].itemsize, rows=len(prompts),
                              tokens=opts.max_seq_len or longest)
    compile_on = opts.compile == "on" or (opts.compile == "auto" and device.type == "cuda")
    quant = one_quant(opts.quant, group_size=opts.group_size, backend=opts.quant_backend, lm_head=opts.quant_lm_head,
                      config=config, device=device, dtype=dtype)
    return GenerateRequest(opts, source, device, dtype, prompts, texts, tokenizer, stops, sampling, compile_on, quant)
