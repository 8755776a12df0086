"""`kiln bench llm`: HF and kiln generation engines side by side, in one process, on one prompt.

`bench_llm` checks the request (kiln.bench.llm.llm_options), refuses an output directory that holds
results, runs the bench and writes its results; `LlmBench` is the run, phase by phase:

1. Ceilings measured on the spot (kiln.bench.ceilings): read and copy bandwidth, best matmul FLOP/s.
2. Models: one HF model (random weights from its config, or the checkpoint) and one kiln model
   loaded from the HF model's state dict, so both libraries run identical weights and a logits
   check compares them; without HF rows kiln builds its own. With `--quant`, a quantized copy of
   kiln's model per entry (kiln.bench.llm.llm_quant), with its quality against the unquantized model.
3. Warm-up, row by row: the first `generate` (compiles, captures) and `warmup` more. A row starts
   its warm-up only before `deadline_s`, so a time-boxed run ends with every row it could finish.
4. Prefill: each engine's prompt forward, timed interleaved (`measure_interleaved`).
5. Generate: `repeats` rounds, each running every engine once (interleaved), with a clock mark
   per token (CUDA events, no host sync): TTFT, decode time, per-token intervals.
6. Peers (kiln.bench.peers.table: gpt-fast) after kiln's rows, then the figures (kiln.bench.llm.llm_rows).

Prefill FLOPs are counted once by torch.utils.flop_counter on an eager kiln prefill (attention
counted in full, as the counter does, not halved for the causal mask) and shared by all rows: the
same math. Memory per row is what the engine would need alone: weights + what it keeps after
warm-up (cache, graph pools) + its peak transient during a request (CUDA only).
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kiln.bench.ceilings import Ceilings, measure_ceilings
from kiln.bench.formulas import attended_kv_bytes, kv_bytes_per_step
from kiln.bench.llm.llm_engine_row import EngineRow, LogitsParity
from kiln.bench.llm.llm_engines import HF_ENGINES, HfEngine, KilnEngine
from kiln.bench.llm.llm_memory import check_bench_fits
from kiln.bench.llm.llm_options import LlmBenchOptions, LlmBenchPlan, check_options
from kiln.bench.llm.llm_peer_context import LlmPeerContext
from kiln.bench.llm.llm_profile import profile_prefill_rows, profile_rows
from kiln.bench.llm.llm_quant import build_variants, load_ppl_tokens, measure_quality
from kiln.bench.llm.llm_report import write_llm_results
from kiln.bench.llm.llm_rows import LlmRow, finish_rows
from kiln.bench.peers import table as registry
from kiln.bench.results import refuse_held_results
from kiln.bench.row_failure import failure
from kiln.compile import compile_counters
from kiln.llm.config import resolve_model
from kiln.llm.engine import warmup_reasons
from kiln.llm.hf_model import build_hf_model, hf_available
from kiln.llm.weights import (
    TORCH_DTYPES,
    build_decoder,
    decode_weight_bytes,
    empty_decoder,
    has_weights,
    load_hf_state_dict,
)
from kiln.monitor.env import collect_env
from kiln.monitor.flops import count_step_flops
from kiln.profile.decode import window_steps
from kiln.runtime import default_run_dir
from kiln.timing import StepClock, measure_interleaved, time_calls

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _allocated(device: torch.device) -> int:
    return int(torch.cuda.memory_allocated(device)) if device.type == "cuda" else 0


def _param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


class LlmBench:
    """One run of a checked plan (`opts`): the prompt, one row per engine and quantization, the
    models, and the phases of the module docstring as methods, in the order `run` calls them."""

    def __init__(self, opts: LlmBenchPlan, log: Log = _stderr):
        self.opts, self.log = opts, log
        self.device = torch.device(opts.device)
        self.dtype = TORCH_DTYPES[opts.dtype]
        self.source = resolve_model(opts.model)
        self.config = self.source.config
        gen = torch.Generator().manual_seed(opts.seed)
        # One prompt set for every batch size: batch B takes the first B, so the first prompt is the same in all.
        self.prompts = torch.randint(0, self.config.vocab_size, (max(opts.batches), opts.prompt_len),
                                     generator=gen).tolist()
        several = len(opts.batches) > 1
        rows = [LlmRow(e, q, model=opts.model, dtype=opts.dtype, prompt_len=opts.prompt_len, new_tokens=opts.new_tokens,
                       batch=b, label_batch=several) for b in opts.batches for e in opts.engines
                for q in (opts.quants if e.startswith("kiln") else ["none"])]
        self.rows = {r.name: r for r in rows}
        self.hf_model = self.kiln_model = None
        self.variants: dict[str, Any] = {}
        self.quality: dict[str, Any] = {}
        self.started = time.perf_counter()
        self.ceilings: Ceilings | None = None
        self.parity: LogitsParity | None = None
        self.prompt_flops: int | None = None
        """One prompt's prefill FLOPs, once counted (`prefill_flops`)."""

    # -- models ---------------------------------------------------------------------------------
    def build_models(self) -> None:
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
        peers_asked = any(peer.asked(self.opts) for peer in registry.peers_for("llm"))  # they run kiln's weights
        if any(n.startswith("kiln") for n in self.rows) or peers_asked:
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
                r.row.update(**v.figures.to_json())
                if v.status != "ok" and r.ok:
                    r.row.update(status=v.status, reason=v.reason)

    def check_parity(self, positions: int = 128) -> None:
        """Logits of both models on the first `positions` prompt tokens (eager, same weights)."""
        if self.hf_model is None or self.kiln_model is None:
            return
        tokens = torch.tensor(self.prompts[:1], device=self.device)[:, :positions]
        with torch.inference_mode():
            ref = self.hf_model(tokens).logits.float()
            got = self.kiln_model(tokens).float()
        self.parity = LogitsParity(
            logits_positions=tokens.shape[1],
            logits_max_abs_err=float((ref - got).abs().max()),
            logits_max_abs_ref=float(ref.abs().max()),
            logits_top1_match=float((ref.argmax(-1) == got.argmax(-1)).float().mean()),
        )
        del ref, got

    # -- phases ---------------------------------------------------------------------------------
    def _make(self, r: LlmRow):
        prompts = self.prompts[: r.row.batch]
        if r.engine_name in HF_ENGINES:
            return HfEngine(r.engine_name, self.hf_model, prompts, self.opts.new_tokens)
        return KilnEngine(r.engine_name, self.variants[r.quant].model, prompts, self.opts.new_tokens,
                          self.opts.inductor_options, prefill=self.opts.prefill, tuning=self.opts.tuning,
                          decode_attention=self.opts.decode_attention, decode_matvec=self.opts.decode_matvec)

    def warm_up(self, r: LlmRow) -> None:
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
        r.row.note = r.engine.note
        why = ""  # kiln's engine: each compiled variant's seconds, and whether it compiled or loaded its graphs
        if isinstance(r.engine, KilnEngine) and r.engine.engine.compiled:
            why = f": {warmup_reasons(r.engine.engine.compiled, r.engine.engine.graph_cache)}"
        self.log(f"{r.name}: warm-up {r.row.warmup_s:.1f} s (first call {first:.1f} s){why}")

    def time_prefill(self, ready: list[LlmRow]) -> None:
        """Each engine's prompt forward, interleaved. An engine whose prefill cannot be called on
        its own keeps its generate figures; its prefill figures stay empty, with the reason."""
        sides = {}
        for r in ready:
            try:
                r.engine.prefill()
                sides[r.name] = r.engine.prefill
            except Exception as exc:
                r.row.prefill_error = failure(exc)[1]
                self.log(f"{r.name}: prefill alone failed ({r.row.prefill_error}); no prefill figures")
        if not sides:
            return
        for name, timing in measure_interleaved(sides, warmup=1, repeats=self.opts.prefill_repeats,
                                                device=self.device).items():
            self.rows[name].row.update(prefill_ms=timing.median_s * 1e3, prefill_ms_p90=timing.quantile_s(0.9) * 1e3)

    def _one_generate(self, r: LlmRow) -> None:
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

    def time_generate(self, ready: list[LlmRow]) -> None:
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
        """One prompt's prefill FLOPs (a batch of B prompts of one length does B times as many)."""
        tokens = torch.tensor(self.prompts[:1], device=self.device)
        with torch.inference_mode():
            if self.kiln_model is not None:
                return count_step_flops(lambda: self.kiln_model(tokens, last_only=True), device=self.device)
            if self.hf_model is not None:
                return count_step_flops(lambda: self.hf_model(tokens, logits_to_keep=1), device=self.device)
        return None

    def finish_rows(self, flops: int | None) -> list[EngineRow]:
        """Every row's reported figures (kiln.bench.llm.llm_rows), from what decode reads per step."""
        weight_bytes = decode_weight_bytes(self.kiln_model) if self.kiln_model is not None else (
            _param_bytes(self.hf_model) - (0 if self.config.tie_embeddings else
                                            self.config.vocab_size * self.config.dim * self.dtype.itemsize))
        return finish_rows(self.rows, self.opts, self.ceilings, prompt_flops=flops, weight_bytes=weight_bytes,
                           kv_bytes=self.kv_bytes(), model_bytes=_param_bytes(self.kiln_model or self.hf_model), parity=self.parity)

    def kv_bytes(self) -> dict[int, int]:
        """Batch size -> KV-cache bytes a decode step reads, averaged over the request (kiln.bench.formulas)."""
        c, o = self.config, self.opts
        return {b: kv_bytes_per_step(batch=b, prompt_len=o.prompt_len, new_tokens=o.new_tokens, n_layers=c.n_layers,
                                     kv_heads=c.n_kv_heads, head_dim=c.head_dim, dtype_bytes=self.dtype.itemsize,
                                     windows=c.windows) for b in o.batches}

    def window_kv_bytes(self, batch: int, steps: int) -> int:
        """KV-cache bytes a step of a profiled decode window of `steps` reads, averaged over the window
        (kiln.profile.decode.window_steps; kiln.bench.formulas)."""
        c, o = self.config, self.opts
        first, last = window_steps(steps)
        return attended_kv_bytes(lengths=[o.prompt_len] * batch, first_step=first, last_step=last, n_layers=c.n_layers,
                                 kv_heads=c.n_kv_heads, head_dim=c.head_dim, dtype_bytes=self.dtype.itemsize,
                                 windows=c.windows)

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
                self.log(f"{r.name}: skipped ({r.row.reason})")
                continue
            try:
                self.warm_up(r)
                ready.append(r)
            except Exception as exc:
                r.fail(exc)
                self.log(f"{r.name}: {r.row.status}: {r.row.reason}")
                gc.collect()
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
        ready = [r for r in ready if r.ok]
        if ready:
            self.time_prefill(ready)
            self.time_generate(ready)
            if self.opts.profile_decode:
                profile_rows(self, ready)
            if self.opts.profile_prefill:
                profile_prefill_rows(self, ready)

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
        flops = self.prompt_flops = self.prefill_flops()
        ctx = self.peer_context()
        peers = registry.peers_for("llm")
        prepared: list = []
        try:
            for peer in peers:  # heavy preparation (converted checkpoints) before kiln's rows are timed
                prepared.append(peer.prepare(ctx))
            self.run_kiln_rows()
            found = [peer.run(prep, ctx) for peer, prep in zip(peers, prepared)]
        finally:
            for prep in prepared:
                if prep is not None:
                    prep.close()  # gpt-fast's checkpoints are the size of the model
        kiln_rows = self.finish_rows(flops)  # before the peers' rows: those set kiln's against theirs
        peer_rows = [row for peer, rows in zip(peers, found) for row in peer.rows(rows, ctx)]
        return [row.to_json() for row in kiln_rows + peer_rows]

    def peer_context(self) -> LlmPeerContext:
        """What the peers of kiln.bench.peers.table are given (kiln.bench.llm.llm_peer_context)."""
        return LlmPeerContext(plan=self.opts, kiln_model=self.kiln_model, device=self.device, started=self.started,
                              log=self.log, ceilings=self.ceilings, kv_bytes=self.kv_bytes(), bench_rows=self.rows)


def run_llm_bench(opts: LlmBenchPlan, log: Log = _stderr) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (one per engine, all statuses) and the measured context (ceilings, model figures)."""
    bench = LlmBench(opts, log)
    rows = bench.run()
    context = {"ceilings": bench.ceilings.as_dict() if bench.ceilings else None, "parity": bench.parity.to_json() if bench.parity else {},
               "quality": bench.quality, "run_s": time.perf_counter() - bench.started,
               "model_config": {k: v for k, v in vars(bench.config).items() if k != "rope"},
               "rope": vars(bench.config.rope)}
    return rows, context


@dataclass
class LlmBenchResult:
    """What `bench_llm` measured and wrote."""

    rows: list[dict[str, Any]]
    """One row per engine (and quantization), every status."""
    title: str
    """The results' title: model, dtype, sizes, where it ran."""
    written: dict[str, Path]
    """The files written (results.json, results.md, results.png)."""


def bench_llm(opts: LlmBenchOptions, *, command: str, log: Log = _stderr) -> LlmBenchResult:
    """Check `opts` (ConfigError before any work), run the bench and write its results under
    `opts.out` (default runs/<time>-bench-llm-<name>); `command` is recorded with them."""
    plan = check_options(opts)
    check_bench_fits(plan)  # every model it builds, before the first: the host's OOM killer leaves no message
    name = plan.preset or Path(plan.model).name
    out = Path(opts.out) if opts.out else default_run_dir(f"bench-llm-{name}")
    refuse_held_results(out)
    plan.profile_dir = str(out / "decode_profile") if plan.profile_decode else None
    plan.prefill_profile_dir = str(out / "prefill_profile") if plan.profile_prefill else None
    device = torch.device(plan.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    quant = f", quant {','.join(plan.quants)}" if list(plan.quants) != ["none"] else ""
    batches = ",".join(map(str, plan.batches))
    title = (f"kiln bench llm: {plan.model} ({plan.dtype}, batch {batches}, prompt {plan.prompt_len}, "
             f"{plan.new_tokens} new tokens{quant}, {where})")
    rows, context = run_llm_bench(plan, log)
    config = {"bench": dataclasses.asdict(plan), **context}
    written = write_llm_results(out, rows, env=collect_env(), config=config, command=command, title=title)
    return LlmBenchResult(rows=rows, title=title, written=written)
