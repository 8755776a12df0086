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
a row achieves and `roofline_frac` is that over the measured copy bandwidth.
With `--quant`, each kiln engine runs once per quant entry on a quantized copy of its model
(kiln.bench.llm_quant): weight bytes, roofline and memory are the copy's own, quality (logit
drift, perplexity) is measured against the unquantized model, and `decode_vs_unquantized` is
the ratio to the same engine's unquantized row. A row starts its warm-up only before
`deadline_s`, so a time-boxed run ends with every row it could finish (the rest `skipped`).
Prefill FLOPs are counted once by torch.utils.flop_counter on an eager kiln prefill (attention counted in full, as
the counter does, not halved for the causal mask) and shared by all rows: the same math. Memory per row is
what the engine would need alone: weights + what it keeps after warm-up (cache, graph pools) +
its peak transient during a request (CUDA only).
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.bench.ceilings import Ceilings, bandwidth_fractions, measure_ceilings
from kiln.bench.compile_bench import failure
from kiln.bench.formulas import (
    decode_tok_s,
    peak_fraction,
    prefill_tok_s,
    ratio,
    request_tok_s,
    roofline_tok_s,
    tflops,
)
from kiln.bench.llm_engines import ENGINES, HF_ENGINES, HfEngine, KilnEngine
from kiln.bench.llm_peers import finish_peers, prepare_peers, run_peers
from kiln.bench.llm_profile import profile_rows
from kiln.bench.llm_quant import build_variants, load_ppl_tokens, mark_drift, measure_quality
from kiln.compile import compile_counters
from kiln.llm.hf_model import build_hf_model, hf_available
from kiln.llm.quant import QuantSpec
from kiln.llm.weights import TORCH_DTYPES, has_weights
from kiln.timing import StepClock, Timing, measure_interleaved, time_calls

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
    quants: dict[str, QuantSpec] = field(default_factory=lambda: {"none": QuantSpec()})
    """`--quant` entry (`int4`, `int4@inductor`, ...) -> checked spec (kiln.llm.quant.check_quant); each
    kiln engine runs once per entry."""
    ppl_file: str | None = None
    """Local text (or token-id) file for perplexity; None skips perplexity."""
    ppl_context: int = 1024
    ppl_max_tokens: int | None = 16384
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
    """Where the decode profiles go (one folder per row); set by the CLI from --out."""
    gpt_fast: str | None = None
    """A gpt-fast checkout: its rows (kiln.bench.peers.gpt_fast) run after kiln's, on the same weights."""
    gpt_fast_quants: tuple[str, ...] = ("none", "int4")
    gpt_fast_group_size: int = 128
    gpt_fast_timeout_s: float = 600.0
    """Seconds all gpt-fast rows together may take (conversion excluded)."""
    end_by_s: float | None = None
    """The gpt-fast rows end by this many seconds after the bench started (a time-boxed run)."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _allocated(device: torch.device) -> int:
    return int(torch.cuda.memory_allocated(device)) if device.type == "cuda" else 0


def _param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


class _Row:
    """One engine's figures as they are gathered."""

    def __init__(self, engine: str, quant: str, base: dict[str, Any]):
        self.name = engine if quant == "none" else f"{engine}[{quant}]"
        self.engine_name, self.quant = engine, quant
        self.row: dict[str, Any] = {"engine": engine, "quant": quant, **base, "status": "ok", "reason": None}
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
        rows = [_Row(e, q, base) for e in opts.engines for q in (opts.quants if e.startswith("kiln") else ["none"])]
        self.rows = {r.name: r for r in rows}
        self.hf_model = self.kiln_model = None
        self.variants: dict[str, Any] = {}
        self.quality: dict[str, Any] = {}
        self.started = time.perf_counter()
        self.ceilings: Ceilings | None = None
        self.parity: dict[str, Any] = {}

    # -- models ---------------------------------------------------------------------------------
    def build_models(self) -> None:
        from kiln.llm.weights import build_decoder, empty_decoder, load_hf_state_dict

        hf_rows = [r for r in self.rows.values() if r.engine_name in HF_ENGINES]
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
        if any(n.startswith("kiln") for n in self.rows) or self.opts.gpt_fast:
            self.log(f"building kiln's decoder ({'weights of the HF model' if self.hf_model else 'own weights'})")
            if self.hf_model is not None:
                self.kiln_model = load_hf_state_dict(empty_decoder(self.config, device=self.device, dtype=self.dtype),
                                                     self.hf_model.state_dict(), where="the HF model")
            else:
                self.kiln_model = build_decoder(self.source, device=self.device, dtype=self.dtype, seed=self.opts.seed)
            self.build_variants()

    def build_variants(self) -> None:
        """Quantized copies of kiln's model (one per kind asked for) and their quality figures."""
        self.variants = build_variants(self.kiln_model, self.opts.quants, self.log)
        if any(spec.kind != "none" for spec in self.opts.quants.values()) or self.opts.ppl_file:
            tokens = load_ppl_tokens(self.opts.ppl_file, self.source, self.config.vocab_size)
            self.quality = measure_quality(self.variants, self.kiln_model, ppl_tokens=tokens,
                                           ppl_context=self.opts.ppl_context, ppl_max_tokens=self.opts.ppl_max_tokens,
                                           real_weights=has_weights(self.source.directory), log=self.log)
        for r in self.rows.values():
            v = self.variants.get(r.quant) if r.engine_name.startswith("kiln") else None
            if v is not None:
                r.row.update(v.figures)
                if v.status != "ok" and r.ok:
                    r.row.update(status=v.status, reason=v.reason)

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
    def _make(self, r: _Row):
        if r.engine_name in HF_ENGINES:
            return HfEngine(r.engine_name, self.hf_model, self.prompts, self.opts.new_tokens)
        return KilnEngine(r.engine_name, self.variants[r.quant].model, self.prompts, self.opts.new_tokens,
                          self.opts.inductor_options, prefill=self.opts.prefill, tuning=self.opts.tuning,
                          decode_attention=self.opts.decode_attention, decode_matvec=self.opts.decode_matvec)

    def warm_up(self, r: _Row) -> None:
        before_counters, before_bytes = compile_counters(), _allocated(self.device)
        r.engine = self._make(r)
        clock = StepClock(self.device)
        first = time_calls(lambda: r.engine.generate(clock), calls=1, device=self.device)
        rest = [time_calls(lambda: r.engine.generate(clock), calls=1, device=self.device)
                for _ in range(self.opts.warmup)]
        after = compile_counters()
        r.held_bytes = _allocated(self.device) - before_bytes
        compiled = r.engine_name.endswith("compiled")
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
        for r in self.rows.values():
            row = r.row
            kiln_row = r.engine_name.startswith("kiln")
            row.setdefault("weight_bytes", weight_bytes)
            row.update(prefill_flops=flops, **self.parity if kiln_row and r.quant == "none" else {})
            row["roofline_tok_s"] = roofline_tok_s(c.bandwidth, row["weight_bytes"], o.batch)
            row["spec_roofline_tok_s"] = roofline_tok_s(c.spec_bytes_per_s, row["weight_bytes"], o.batch)
            row_model_bytes = row.get("model_bytes") if kiln_row and row.get("model_bytes") else model_bytes
            if not r.ok or not r.decode:
                continue
            decode_s = statistics.median(r.decode)
            if row.get("prefill_ms"):
                prefill_s = row["prefill_ms"] / 1e3
                row.update(prefill_tok_s=prefill_tok_s(o.batch, o.prompt_len, prefill_s),
                           prefill_tflops=tflops(flops, prefill_s),
                           prefill_peak_frac=peak_fraction(flops, prefill_s, c.matmul_flops_per_s),
                           prefill_spec_frac=peak_fraction(flops, prefill_s, c.spec_flops_per_s))
            row.update(
                ttft_ms=statistics.median(r.ttft) * 1e3,
                decode_tok_s=decode_tok_s(o.batch, o.new_tokens, decode_s),
                token_ms_p50=Timing(tuple(r.intervals)).quantile_s(0.5) * 1e3 if r.intervals else None,
                token_ms_p90=Timing(tuple(r.intervals)).quantile_s(0.9) * 1e3 if r.intervals else None,
                generate_s=statistics.median(r.totals),
                request_tok_s=request_tok_s(o.batch, o.new_tokens, statistics.median(r.totals)),
                peak_mem_bytes=row_model_bytes + r.held_bytes + max(r.transient) if r.transient else None,
            )
            bandwidth_fractions(row, c, o.batch)
        self._ratios()
        for r in self.rows.values():
            mark_drift(r.row)
        return [r.row for r in self.rows.values()]

    def _ratios(self) -> None:
        ok = {n: r for n, r in self.rows.items() if r.ok and r.row.get("decode_tok_s")}
        base = next((ok[n] for n in ("hf-compiled", "hf-eager") if n in ok), None)
        ref = next((ok[n] for n in ("hf-eager", "hf-compiled", "kiln-eager", "kiln-compiled") if n in ok), None)
        for r in ok.values():
            unquantized = ok.get(r.engine_name)
            if r.quant != "none" and unquantized is not None:
                r.row["decode_vs_unquantized"] = ratio(r.row["decode_tok_s"], unquantized.row["decode_tok_s"])
            if base is not None:
                r.row.update(vs_hf=base.name, decode_vs_hf=ratio(r.row["decode_tok_s"], base.row["decode_tok_s"]))
                if base.row.get("prefill_ms") and r.row.get("prefill_ms"):
                    r.row["prefill_vs_hf"] = ratio(base.row["prefill_ms"], r.row["prefill_ms"])
            if ref is not None and r.tokens and ref.tokens:
                a, b = r.tokens[0], ref.tokens[0]
                r.row.update(greedy_ref=ref.name,
                             greedy_match=next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))

    # -- the run --------------------------------------------------------------------------------
    def run_kiln_rows(self) -> None:
        """Warm up every row (before the deadline), then time prefill and generate interleaved."""
        ready = []
        for r in self.rows.values():
            if not r.ok:
                continue
            elapsed = time.perf_counter() - self.started
            if self.opts.deadline_s is not None and elapsed > self.opts.deadline_s:
                r.row.update(status="skipped", reason=f"not started: the run's --deadline-s {self.opts.deadline_s:g} "
                             f"had passed ({elapsed:.0f} s)")
                self.log(f"{r.name}: skipped ({r.row['reason']})")
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
            if self.opts.profile_decode:
                profile_rows(self, ready)

    def run(self) -> list[dict[str, Any]]:
        self.log(f"measuring ceilings on {self.device}")
        self.ceilings = measure_ceilings(self.device, self.dtype)
        c = self.ceilings
        spec = (f"; datasheet ({c.spec_name}) {c.spec_bytes_per_s / 1e9:.4g} GB/s, {c.spec_flops_per_s / 1e12:.4g} TFLOP/s"
                if c.spec_bytes_per_s and c.spec_flops_per_s else "")
        self.log(f"read {c.bandwidth / 1e9:.4g} GB/s ({c.read_kernel}), copy {c.copy_bytes_per_s / 1e9:.4g} GB/s, "
                 f"best matmul {c.matmul_flops_per_s / 1e12:.4g} TFLOP/s (n={c.matmul_n}){spec}")
        self.build_models()
        self.check_parity()
        flops = self.prefill_flops()
        prep = prepare_peers(self)
        try:
            self.run_kiln_rows()
            peers = run_peers(self, prep)
        finally:
            if prep is not None:
                prep.close()  # gpt-fast's checkpoints are the size of the model
        return self.finish_rows(flops) + finish_peers(self, peers)


def run_llm_bench(opts: LlmBenchOptions, log: Log = _stderr) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (one per engine, all statuses) and the measured context (ceilings, model figures)."""
    bench = LlmBench(opts, log)
    rows = bench.run()
    context = {"ceilings": bench.ceilings.as_dict() if bench.ceilings else None, "parity": bench.parity,
               "quality": bench.quality, "run_s": time.perf_counter() - bench.started,
               "model_config": {k: v for k, v in vars(bench.config).items() if k != "rope"},
               "rope": vars(bench.config.rope)}
    return rows, context
