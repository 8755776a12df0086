"""`kiln generate`: text (or token ids) from a Llama-family model through kiln's engine.

Argument parsing and input checks only; the model and engine live in kiln.llm. Every check
(flags, model, tokenizer, prompt lengths) runs before the model is built.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from kiln.cli.llm_args import (
    add_decode_attention_flag,
    add_decode_matvec_flag,
    add_model_flags,
    add_quant_flags,
    at_least,
    check_decode_attention,
    check_decode_matvec,
    parse_ids,
    resolve_device_flag,
    resolve_dtype_flag,
    resolve_quant_flags,
)
from kiln.config.errors import ConfigError

FLAGS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p"}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text with kiln's fast decoder (static KV cache, compiled + CUDA-graphed decode)",
        description="Generate from a prompt. Text prompts need a tokenizer.json (the model directory's or "
        "--tokenizer); --tokens takes token ids and works with any model, presets included. Several "
        "--prompt/--tokens, or a --prompt-file with one prompt per line, form one batch.",
    )
    add_model_flags(p)
    src = p.add_argument_group("prompt (one of)")
    src.add_argument("--prompt", action="append", help="prompt text (repeat for a batch)")
    src.add_argument("--prompt-file", help="file with one prompt per line (empty lines skipped)")
    src.add_argument("--tokens", action="append", help="prompt as comma-separated token ids (repeat for a batch)")
    p.add_argument("--tokenizer", help="directory or tokenizer.json to use instead of the model directory's")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate per prompt (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--seed", type=int, help="seed for sampling")
    p.add_argument("--stop-tokens", help="comma-separated stop token ids (default: the model's EOS ids)")
    p.add_argument("--ignore-eos", action="store_true", help="no stop tokens: always generate --max-new-tokens")
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                   help="compile prefill/decode and capture decode in a CUDA graph (auto: on for CUDA)")
    p.add_argument("--max-seq-len", type=int, help="KV-cache slots (default: padded prompt + new tokens)")
    add_quant_flags(p, many=False)
    add_decode_attention_flag(p)
    add_decode_matvec_flag(p)
    p.add_argument("--json", help="also write prompts, tokens, text and timings to this JSON file")
    p.add_argument("--random-weights", action="store_true",
                   help="generate from random weights when the --model directory has none (the output is noise)")
    p.set_defaults(run=run)


@dataclass
class Request:
    source: object
    device: object
    dtype: str
    prompts: list[list[int]]
    texts: list[str] | None
    tokenizer: object | None
    stop_tokens: list[int]
    sampling: object
    compile: bool
    quant: object


def _prompts(args: argparse.Namespace, tokenizer_dir: Path | None) -> tuple[list[list[int]], list[str] | None, object]:
    from kiln.llm.tokenizer import load_tokenizer

    given = [flag for flag, value in (("--prompt", args.prompt), ("--prompt-file", args.prompt_file),
                                      ("--tokens", args.tokens)) if value]
    if len(given) != 1:
        raise ConfigError("--prompt", f"give exactly one of --prompt, --prompt-file, --tokens (got {given or 'none'})")
    tokenizer = None
    if args.tokenizer or (tokenizer_dir is not None and args.tokens is None):
        where = Path(args.tokenizer) if args.tokenizer else tokenizer_dir
        tokenizer = load_tokenizer(where, "--tokenizer" if args.tokenizer else "--model")
    if args.tokens:
        return [parse_ids(t, "--tokens") for t in args.tokens], None, tokenizer
    if args.prompt_file:
        path = Path(args.prompt_file)
        try:
            texts = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except OSError as exc:
            raise ConfigError("--prompt-file", f"cannot read {path}: {exc}") from None
        if not texts:
            raise ConfigError("--prompt-file", f"{path} has no prompts (one per line)")
    else:
        texts = list(args.prompt)
    if tokenizer is None:
        raise ConfigError("--prompt", "text prompts need a tokenizer: the model has no tokenizer.json; "
                          "pass --tokenizer DIR, or token ids with --tokens")
    return [tokenizer.encode(t) for t in texts], texts, tokenizer


def _check_tokenizer_eos(directory: Path, stops: list[int], key: str) -> None:
    """The model's stop tokens must include its tokenizer's end-of-text: otherwise generation runs past
    the real end, or stops at an ordinary token (an export whose config kept a preset's ids)."""
    from kiln.data.special_tokens import agrees, special_tokens

    eos = special_tokens(directory).get("eos_token_id")
    if eos is not None and not agrees(stops, eos[1]):
        raise ConfigError(key, f"{directory}: the tokenizer ends text with {eos[0]!r} (id {eos[1]}) but the model "
                          f"stops at {stops or 'nothing'} (generation_config.json / config.json eos_token_id); "
                          f"re-export the run (`kiln export RUN_DIR --out DIR --force` takes the tokenizer's ids), "
                          f"or pass --stop-tokens {eos[1]}")


def plan(args: argparse.Namespace) -> Request:
    from kiln.llm.config import resolve_model
    from kiln.llm.engine import MAX_STOP_TOKENS, check_lengths
    from kiln.llm.sampling import Sampling, check_sampling
    from kiln.llm.tokenizer import find_tokenizer, generation_stop_tokens
    from kiln.llm.weights import has_weights

    at_least("--max-new-tokens", args.max_new_tokens, 1)
    if args.json:
        from kiln.outputs import check_writable_file

        check_writable_file(args.json, "--json")
    at_least("--max-seq-len", args.max_seq_len, 2)
    sampling = check_sampling(Sampling(args.temperature, args.top_k, args.top_p), FLAGS)
    device = resolve_device_flag(args.device)
    dtype = resolve_dtype_flag(args.dtype, device)
    source = resolve_model(args.model)
    config = source.config
    if source.directory is not None and not has_weights(source.directory) and not args.random_weights:
        raise ConfigError("--model", f"{source.directory} has no *.safetensors weights; pass --random-weights "
                          "to generate from random weights anyway (the output is noise)")
    check_decode_attention(args.decode_attention, device, dtype, config.head_dim)
    check_decode_matvec(args.decode_matvec, device, dtype)
    tokenizer_dir = source.directory if find_tokenizer(source.directory) else None
    prompts, texts, tokenizer = _prompts(args, tokenizer_dir)
    check_lengths([len(p) for p in prompts], args.max_new_tokens, max_positions=config.max_positions,
                  max_seq_len=args.max_seq_len,
                  keys={"max_new_tokens": "--max-new-tokens", "max_seq_len": "--max-seq-len", "prompt": "--prompt"})
    bad = next((t for p in prompts for t in p if not 0 <= t < config.vocab_size), None)
    if bad is not None:
        raise ConfigError("--tokens", f"token id {bad} is outside the model's vocabulary [0, {config.vocab_size})")
    if args.ignore_eos:
        stops = []
    elif args.stop_tokens is not None:
        stops = parse_ids(args.stop_tokens, "--stop-tokens")
    else:
        stops = generation_stop_tokens(source.directory, config.eos_token_ids)
        if tokenizer is not None:
            _check_tokenizer_eos(tokenizer.path.parent, stops, "--tokenizer" if args.tokenizer else "--model")
    if len(set(stops)) > MAX_STOP_TOKENS:
        raise ConfigError("--stop-tokens", f"at most {MAX_STOP_TOKENS} stop tokens, got {len(set(stops))}")
    if device.type == "cpu":  # before the model is built: an 8B in fp32 would meet the OOM killer
        from kiln.llm.weights import TORCH_DTYPES
        from kiln.models.host_memory import check_generation_fits

        longest = max(len(p) for p in prompts) + args.max_new_tokens
        check_generation_fits(config, dtype=dtype, dtype_bytes=TORCH_DTYPES[dtype].itemsize, rows=len(prompts),
                              tokens=args.max_seq_len or longest)
    compile_on = args.compile == "on" or (args.compile == "auto" and device.type == "cuda")
    quant = resolve_quant_flags([args.quant], args, config, device, dtype)[args.quant]
    if quant.kind == "nf4":
        from kiln.llm.quant import bitsandbytes_missing

        if missing := bitsandbytes_missing():
            raise ConfigError("--quant", f"nf4 needs bitsandbytes: {missing}")
    return Request(source, device, dtype, prompts, texts, tokenizer, stops, sampling, compile_on, quant)


def run(args: argparse.Namespace) -> int:
    req = plan(args)  # ConfigError -> exit 2 before the model is built

    from kiln.llm.engine import Engine
    from kiln.llm.quant import quantize_decoder
    from kiln.llm.weights import TORCH_DTYPES, build_decoder, decode_weight_bytes, has_weights
    from kiln.timing import StepClock

    model = build_decoder(req.source, device=req.device, dtype=TORCH_DTYPES[req.dtype], seed=args.seed or 0)
    if not has_weights(req.source.directory):
        print(f"kiln: {args.model} has no weights: random weights, the output is noise", file=sys.stderr)
    if req.quant.kind != "none":
        before = decode_weight_bytes(model)
        model = quantize_decoder(model, req.quant)  # the unquantized copy is freed with the last reference
        print(f"kiln: quantized {req.quant.describe()}: decode reads {decode_weight_bytes(model) / 2**30:.2f} GiB of "
              f"weights per token ({before / 2**30:.2f} GiB unquantized)", file=sys.stderr)
    engine = Engine(model, compile=req.compile, decode_attention=args.decode_attention,
                    decode_matvec=args.decode_matvec)
    clock = StepClock(req.device)
    if req.compile:
        print("kiln: compiling prefill and decode for this request's shape (first call; Triton's and inductor's "
              "caches make a later process faster)", file=sys.stderr, flush=True)
    out = engine.generate(req.prompts, max_new_tokens=args.max_new_tokens, sampling=req.sampling,
                          stop_tokens=req.stop_tokens, seed=args.seed, max_seq_len=args.max_seq_len, clock=clock)
    marks = clock.marks_s()
    texts = [req.tokenizer.decode(t) for t in out.tokens] if req.tokenizer is not None else None
    for i, tokens in enumerate(out.tokens):
        if len(out.tokens) > 1:
            print(f"--- [{i}] ({out.finish[i]}, {len(tokens)} tokens)")
        print(texts[i] if texts is not None else ",".join(map(str, tokens)))
    new = sum(len(t) for t in out.tokens)
    decode_s = marks[-1] - marks[0]
    rate = f", decode {len(req.prompts) * out.steps / decode_s:.1f} tok/s" if out.steps and decode_s > 0 else ""
    compiled = (f" (first call: includes compiling, {sum(engine.compiled.values()):.1f} s: "
                + ", ".join(f"{name.split('[')[0]} {seconds:.1f} s" for name, seconds in engine.compiled.items()) + ")"
                if engine.compiled else "")
    quant = f", {req.quant.describe()}" if req.quant.kind != "none" else ""
    print(f"kiln: {new} tokens, TTFT {marks[0] * 1e3:.1f} ms{rate}{compiled} ({req.device}, {req.dtype}{quant})",
          file=sys.stderr)
    if args.json:
        payload = {"model": args.model, "device": str(req.device), "dtype": req.dtype, "compile": req.compile,
                   "sampling": dataclasses.asdict(req.sampling), "stop_tokens": req.stop_tokens, "prompts": req.texts,
                   "prompt_tokens": req.prompts, "tokens": out.tokens, "text": texts, "finish": out.finish,
                   "ttft_ms": marks[0] * 1e3, "decode_s": decode_s, "steps": out.steps,
                   "compiled": engine.compiled, "quant": dataclasses.asdict(req.quant)}
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0
