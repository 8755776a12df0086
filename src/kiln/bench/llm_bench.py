"""`kiln bench llm`: HF and kiln generation engines side by side, in one process, on one prompt.

1. Ceilings measured on the spot (kiln.bench.ceilings): copy bandwidth, bf16 matmul FLOP/s.
2. Models: one HF model (random weights from its config, or the checkpoint) and one kiln model
   loaded from the HF model's state dict, so both libraries run identical weights and a
   logits check compares them; without HF rows kiln builds its own.
3. Warm-up, engine by engine: the first `generate` (compiles, captures) and `warmup` more.
4. Prefill: each engine's prompt forward, timed interleaved (`measure_interleaved`).
5. Generate: `repeats` rounds, each running every engine once (interleaved), with a clock mark
   per token (CUDA events, no host sync): TTFT, decode tok/s, per-token p50/p90.
Decode at batch B reads every weight once per step, so `weight_bytes × steps/s` is the bandwidth
a row achieves and `roofline_frac` is that over the measured copy bandwidth. Prefill FLOPs are
counted once by torch.utils.flop_counter on an eager kiln prefill (attention counted in full, as
the counter does, not halved for the causal mask) and shared by all rows: the same math. Memory per row is
what the engine would need alone: weights + what it keeps after warm-up (cache, graph pools) +
its peak transient during a request (CUDA only).
"""

from __future__ import annotations

import gc
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.bench.ceilings import Ceilings, measure_ceilings
from kiln.bench.compile_bench import failure
from kiln.bench.llm_engines import ENGINES, HF_ENGINES, HfEngine, KilnEngine
from kiln.bench.timing import StepClock, Timing, measure_interleaved, time_calls
from kiln.compile import compile_counters
from kiln.llm.hf_model import build_hf_model, hf_available
from kiln.llm.weights import TORCH_DTYPES

Log = Callable[[str], None]


@dataclass(frozen=True)
class LlmPreset:
    name: str
    description: str
    model: str
    batch: int
    prompt_len: int
    new_tokens: int
    engines: tuple[str, ...] = ENGINES


PRESETS = {
    # Seed 002 (shared/seeds): Llama 3.2 3B, batch 1, sequence 1024, prefill vs decode tokens/s and
    # memory, eager vs compiled, warm-up before measuring. 256 new tokens, as the H100 goal.
    "seed002-llama3b": LlmPreset(
        name="seed002-llama3b",
        description="Llama-3.2-3B shape, bf16, batch 1, prompt 1024, 256 new tokens: HF eager/compiled vs kiln",
        model="llama-3.2-3b", batch=1, prompt_len=1024, new_tokens=256),
}


@dataclass
class LlmBenchOptions:
    model: str
    """Preset, config.json or model directory (kiln.llm.config.resolve_model)."""
    engines: list[str] = field(default_factory=lambda: list(ENGINES))
    batch: int = 1
    prompt_len: int = 1024
    new_tokens: int = 256
    dtype: str = "bf16"
    device: str = "cuda"
    warmup: int = 1
    """Untimed generate calls after the first (compiling) one."""
    repeats: int = 3
    """Timed generate rounds (every engine once per round)."""
    prefill_repeats: int = 10
    seed: int = 0
    preset: str | None = None
    inductor_options: dict[str, Any] = field(default_factory=dict)
    """Inductor options for kiln-compiled, over kiln's defaults."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _allocated(device: torch.device) -> int:
    return int(torch.cuda.memory_allocated(device)) if device.type == "cuda" else 0


def _param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


class _Row:
    """One engine's figures as they are gathered."""

    def __init__(self, name: str, base: dict[str, Any]):
        self.name = name
        self.row: dict[str, Any] = {"engine": name, "quant": "none", **base, "status": "ok", "reason": None}
        self.engine = None
        self.held_bytes = 0
        self.transient: list[int] = []
        self.ttft: list[float] = []
        self.decode: list[float] = []
        self.intervals: list[float] = []
        self.totals: list[float] = []
        self.tokens: list[list[int]] | None = None

    @property
    def ok(self) -> bool:
        return self.row["status"] == "ok"

    def fail(self, exc: BaseException) -> None:
        self.row["status"], self.row["reason"] = failure(exc)
        self.engine = None


class LlmBench:
    def __init__(self, opts: LlmBenchOptions, log: Log = _stderr):
        from kiln.llm.config import resolve_model

        self.opts, self.log = opts, log
        self.device = torch.device(opts.device)
        self.dtype = TORCH_DTYPES[opts.dtype]
        self.source = resolve_model(opts.model)
        self.config = self.source.config
        gen = torch.Generator().manual_seed(opts.seed)
        self.prompts = torch.randint(0, self.config.vocab_size, (opts.batch, opts.prompt_len), generator=gen).tolist()
        base = {"model": opts.model, "dtype": opts.dtype, "batch": opts.batch, "prompt_len": opts.prompt_len,
                "new_tokens": opts.new_tokens}
        self.rows = {name: _Row(name, base) for name in opts.engines}
        self.hf_model = self.kiln_model = None
        self.ceilings: Ceilings | None = None
        self.parity: dict[str, Any] = {}

    # -- models ---------------------------------------------------------------------------------
    def build_models(self) -> None:
        from kiln.llm.weights import build_decoder, empty_decoder, load_hf_state_dict

        hf_rows = [r for n, r in self.rows.items() if n in HF_ENGINES]
        reason = hf_available() if hf_rows else None
        for row in hf_rows if reason else ():
            row.row.update(status="skipped", reason=reason)
        if hf_rows and not reason:
            self.log(f"building the transformers model ({self.opts.model}, {self.opts.dtype}, {self.device})")
            try:
                self.hf_model = build_hf_model(self.source, device=self.device, dtype=self.dtype, seed=self.opts.seed)
            except Exception as exc:
                for row in hf_rows:
                    row.fail(exc)
        if any(n.startswith("kiln") for n in self.rows):
            self.log(f"building kiln's decoder ({'weights of the HF model' if self.hf_model else 'own weights'})")
            if self.hf_model is not None:
                self.kiln_model = load_hf_state_dict(empty_decoder(self.config, device=self.device, dtype=self.dtype),
                                                     self.hf_model.state_dict(), where="the HF model")
            else:
                self.kiln_model = build_decoder(self.source, device=self.device, dtype=self.dtype, seed=self.opts.seed)

    def check_parity(self, positions: int = 128) -> None:
        """Logits of both models on the first `positions` prompt tokens (eager, same weights)."""
        if self.hf_model is None or self.kiln_model is None:
            return
        tokens = torch.tensor(self.prompts, device=self.device)[:, :positions]
        with torch.inference_mode():
            ref = self.hf_model(tokens).logits.float()
            got = self.kiln_model(tokens).float()
        self.parity = {
            "logits_positions": tokens.shape[1],
            "logits_max_abs_err": float((ref - got).abs().max()),
            "logits_max_abs_ref": float(ref.abs().max()),
            "logits_top1_match": float((ref.argmax(-1) == got.argmax(-1)).float().mean()),
        }
        del ref, got

    # -- phases ---------------------------------------------------------------------------------
    def _make(self, name: str):
        if name in HF_ENGINES:
            return HfEngine(name, self.hf_model, self.prompts, self.opts.new_tokens)
        return KilnEngine(name, self.kiln_model, self.prompts, self.opts.new_tokens, self.opts.inductor_options)

    def warm_up(self, r: _Row) -> None:
        before_counters, before_bytes = compile_counters(), _allocated(self.device)
        r.engine = self._make(r.name)
        clock = StepClock(self.device)
        first = time_calls(lambda: r.engine.generate(clock), calls=1, device=self.device)
        rest = [time_calls(lambda: r.engine.generate(clock), calls=1, device=self.device)
                for _ in range(self.opts.warmup)]
        after = compile_counters()
        r.held_bytes = _allocated(self.device) - before_bytes
        compiled = r.name.endswith("compiled")
        r.row.update(first_call_s=first, warmup_s=first + sum(rest),
                     compile_s=max(0.0, first - min(rest)) if compiled and rest else (first if compiled else None),
                     graphs=after["graphs"] - before_counters["graphs"],
                     graph_breaks=after["graph_breaks"] - before_counters["graph_breaks"],
                     recompiles=(after["recompiles"] - before_counters["recompiles"]
                                 if after["recompiles"] is not None and before_counters["recompiles"] is not None
                                 else None),
                     **r.engine.compile_stats())
        r.row["note"] = r.engine.note
        self.log(f"{r.name}: warm-up {r.row['warmup_s']:.1f} s (first call {first:.1f} s)")

    def time_prefill(self, ready: list[_Row]) -> None:
        """Each engine's prompt forward, interleaved. An engine whose prefill cannot be called on
        its own keeps its generate figures; its prefill figures stay empty, with the reason."""
        sides = {}
        for r in ready:
            try:
                r.engine.prefill()
                sides[r.name] = r.engine.prefill
            except Exception as exc:
                r.row["prefill_error"] = failure(exc)[1]
                self.log(f"{r.name}: prefill alone failed ({r.row['prefill_error']}); no prefill figures")
        if not sides:
            return
        for name, timing in measure_interleaved(sides, warmup=1, repeats=self.opts.prefill_repeats,
                                                device=self.device).items():
            self.rows[name].row["prefill_ms"] = timing.median_s * 1e3
            self.rows[name].row["prefill_ms_p90"] = timing.quantile_s(0.9) * 1e3

    def _one_generate(self, r: _Row) -> None:
        clock = StepClock(self.device)
        before = _allocated(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        total = time_calls(lambda: setattr(r, "tokens", r.engine.generate(clock)), calls=1, device=self.device)
        marks = clock.marks_s()
        if self.device.type == "cuda":
            r.transient.append(int(torch.cuda.max_memory_allocated(self.device)) - before)
        r.totals.append(total)
        r.ttft.append(marks[0])
        r.decode.append(marks[-1] - marks[0])
        r.intervals += [b - a for a, b in zip(marks, marks[1:])]

    def time_generate(self, ready: list[_Row]) -> None:
        for i in range(self.opts.repeats):
            for r in ready:
                if r.ok:
                    try:
                        self._one_generate(r)
                    except Exception as exc:
                        r.fail(exc)
            self.log(f"generate round {i + 1}/{self.opts.repeats} done")

    # -- figures --------------------------------------------------------------------------------
    def prefill_flops(self) -> int | None:
        from kiln.monitor.flops import count_step_flops

        tokens = torch.tensor(self.prompts, device=self.device)
        with torch.inference_mode():
            if self.kiln_model is not None:
                return count_step_flops(lambda: self.kiln_model(tokens, last_only=True), device=self.device)
            if self.hf_model is not None:
                return count_step_flops(lambda: self.hf_model(tokens, logits_to_keep=1), device=self.device)
        return None

    def finish_rows(self, flops: int | None) -> list[dict[str, Any]]:
        from kiln.llm.weights import decode_weight_bytes

        o, c = self.opts, self.ceilings
        weight_bytes = decode_weight_bytes(self.kiln_model) if self.kiln_model is not None else (
            _param_bytes(self.hf_model) - (0 if self.config.tie_embeddings else
                                            self.config.vocab_size * self.config.dim * self.dtype.itemsize))
        model_bytes = _param_bytes(self.kiln_model or self.hf_model)
        steps = o.new_tokens - 1
        for r in self.rows.values():
            row = r.row
            row.update(weight_bytes=weight_bytes, prefill_flops=flops, **self.parity if r.name.startswith("kiln") else {})
            row["roofline_tok_s"] = c.copy_bytes_per_s / weight_bytes * o.batch
            if not r.ok or not r.decode:
                continue
            decode_s = statistics.median(r.decode)
            if row.get("prefill_ms"):
                prefill_s = row["prefill_ms"] / 1e3
                row.update(prefill_tok_s=o.batch * o.prompt_len / prefill_s,
                           prefill_tflops=flops / prefill_s / 1e12 if flops else None,
                           prefill_peak_frac=flops / prefill_s / c.matmul_flops_per_s if flops else None)
            row.update(
                ttft_ms=statistics.median(r.ttft) * 1e3,
                decode_tok_s=o.batch * steps / decode_s if steps else None,
                token_ms_p50=Timing(tuple(r.intervals)).quantile_s(0.5) * 1e3 if r.intervals else None,
                token_ms_p90=Timing(tuple(r.intervals)).quantile_s(0.9) * 1e3 if r.intervals else None,
                generate_s=statistics.median(r.totals),
                peak_mem_bytes=model_bytes + r.held_bytes + max(r.transient) if r.transient else None,
            )
            if row["decode_tok_s"]:
                achieved = weight_bytes * row["decode_tok_s"] / o.batch
                row.update(achieved_gbs=achieved / 1e9, roofline_frac=achieved / c.copy_bytes_per_s)
        self._ratios()
        return [r.row for r in self.rows.values()]

    def _ratios(self) -> None:
        ok = {n: r for n, r in self.rows.items() if r.ok and r.row.get("decode_tok_s")}
        base = next((ok[n] for n in ("hf-compiled", "hf-eager") if n in ok), None)
        ref = next((ok[n] for n in ("hf-eager", "hf-compiled", "kiln-eager", "kiln-compiled") if n in ok), None)
        for r in ok.values():
            if base is not None:
                r.row.update(vs_hf=base.name, decode_vs_hf=r.row["decode_tok_s"] / base.row["decode_tok_s"])
                if base.row.get("prefill_ms") and r.row.get("prefill_ms"):
                    r.row["prefill_vs_hf"] = base.row["prefill_ms"] / r.row["prefill_ms"]
            if ref is not None and r.tokens and ref.tokens:
                a, b = r.tokens[0], ref.tokens[0]
                r.row.update(greedy_ref=ref.name,
                             greedy_match=next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        self.log(f"measuring ceilings on {self.device}")
        self.ceilings = measure_ceilings(self.device, self.dtype)
        self.log(f"copy {self.ceilings.copy_bytes_per_s / 1e9:.4g} GB/s, "
                 f"matmul {self.ceilings.matmul_flops_per_s / 1e12:.4g} TFLOP/s")
        self.build_models()
        self.check_parity()
        flops = self.prefill_flops()
        ready = []
        for r in self.rows.values():
            if not r.ok:
                continue
            try:
                self.warm_up(r)
                ready.append(r)
            except Exception as exc:
                r.fail(exc)
                self.log(f"{r.name}: {r.row['status']}: {r.row['reason']}")
                gc.collect()
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
        ready = [r for r in ready if r.ok]
        if ready:
            self.time_prefill(ready)
            self.time_generate(ready)
        return self.finish_rows(flops)


def run_llm_bench(opts: LlmBenchOptions, log: Log = _stderr) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (one per engine, all statuses) and the measured context (ceilings, model figures)."""
    bench = LlmBench(opts, log)
    rows = bench.run()
    context = {"ceilings": bench.ceilings.as_dict() if bench.ceilings else None, "parity": bench.parity,
               "model_config": {k: v for k, v in vars(bench.config).items() if k != "rope"},
               "rope": vars(bench.config.rope)}
    return rows, context
