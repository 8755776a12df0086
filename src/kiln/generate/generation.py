"""`kiln generate`'s work: check the request, build (and quantize) the model, run kiln's engine,
write the JSON report. Progress notes go through `say`; the CLI prints the text and the summary."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.generate.check_generate import GenerateRequest, check_generate
from kiln.generate.request import GenerateOptions
from kiln.llm.engine import Engine, warmup_reasons
from kiln.llm.quant import quantize_decoder
from kiln.llm.weights import TORCH_DTYPES, build_decoder, decode_weight_bytes, has_weights
from kiln.timing import StepClock


@dataclass
class Generation:
    """What one `kiln generate` produced: tokens per prompt (and text with a tokenizer), timings."""

    req: GenerateRequest
    tokens: list[list[int]]
    finish: list[str]
    texts: list[str] | None
    steps: int
    ttft_s: float
    decode_s: float
    compiled: dict[str, float]
    graph_cache: dict[str, dict[str, Any]]

    def summary(self) -> str:
        """The one line printed on stderr after the text: tokens, TTFT, decode rate, compile time."""
        req = self.req
        new = sum(len(t) for t in self.tokens)
        rate = (f", decode {len(req.prompts) * self.steps / self.decode_s:.1f} tok/s"
                if self.steps and self.decode_s > 0 else "")
        compiled = (f" (first call: includes compiling, {sum(self.compiled.values()):.1f} s: "
                    + warmup_reasons(self.compiled, self.graph_cache) + ")" if self.compiled else "")
        quant = f", {req.quant.describe()}" if req.quant.kind != "none" else ""
        return (f"kiln: {new} tokens, TTFT {self.ttft_s * 1e3:.1f} ms{rate}{compiled} "
                f"({req.device}, {req.dtype}{quant})")


def run_generate(opts: GenerateOptions, say: Callable[[str], None]) -> Generation:
    """Check `opts` (ConfigError, exit 2, before the model is built), generate, write --json."""
    req = check_generate(opts)
    model = build_decoder(req.source, device=req.device, dtype=TORCH_DTYPES[req.dtype], seed=opts.seed or 0)
    if not has_weights(req.source.directory):
        say(f"kiln: {opts.model} has no weights: random weights, the output is noise")
    if req.quant.kind != "none":
        before = decode_weight_bytes(model)
        model = quantize_decoder(model, req.quant)  # the unquantized copy is freed with the last reference
        say(f"kiln: quantized {req.quant.describe()}: decode reads {decode_weight_bytes(model) / 2**30:.2f} GiB of "
            f"weights per token ({before / 2**30:.2f} GiB unquantized)")
    engine = Engine(model, compile=req.compile, decode_attention=opts.decode_attention,
                    decode_matvec=opts.decode_matvec, compile_scope=opts.compile_scope)
    clock = StepClock(req.device)
    if req.compile:
        say("kiln: compiling prefill and decode for this request's shape (first call; Triton's and inductor's "
            "caches make a later process faster)")
    out = engine.generate(req.prompts, max_new_tokens=opts.max_new_tokens, sampling=req.sampling,
                          stop_tokens=req.stop_tokens, seed=opts.seed, max_seq_len=opts.max_seq_len, clock=clock)
    marks = clock.marks_s()
    texts = [req.tokenizer.decode(t) for t in out.tokens] if req.tokenizer is not None else None
    gen = Generation(req, out.tokens, out.finish, texts, out.steps, marks[0], marks[-1] - marks[0], engine.compiled,
                     engine.graph_cache)
    if opts.json:
        _write_json(gen, Path(opts.json))
    return gen


def _write_json(gen: Generation, path: Path) -> None:
    req = gen.req
    payload = {"model": req.opts.model, "device": str(req.device), "dtype": req.dtype, "compile": req.compile,
               "compile_scope": req.opts.compile_scope,
               "sampling": dataclasses.asdict(req.sampling), "stop_tokens": req.stop_tokens, "prompts": req.texts,
               "prompt_tokens": req.prompts, "tokens": gen.tokens, "text": gen.texts, "finish": gen.finish,
               "ttft_ms": gen.ttft_s * 1e3, "decode_s": gen.decode_s, "steps": gen.steps,
               "compiled": gen.compiled, "graph_cache": gen.graph_cache, "quant": dataclasses.asdict(req.quant)}
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
