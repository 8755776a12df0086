"""A `kiln bench llm` row: what is gathered for one engine while it runs, and the figures made of it.

`LlmRow` collects one engine's raw timings (TTFT, decode time, per-token intervals, whole
requests) and memory as the bench measures them, beside its `EngineRow` (kiln.bench.llm.llm_engine_row),
the row of results.json the phases fill. `finish_rows` turns them into the reported
figures, each through kiln.bench.formulas: decode at batch B reads every weight once per step, so
`weight_bytes × steps/s` is the bandwidth a row achieves and its roofline fractions are that over
the measured read stream, the copy and the datasheet; prefill TFLOP/s divide the FLOPs counted
once on an eager prefill by each row's prefill time. `ratios` sets each row against the HF
baseline, its own unquantized row and a greedy-token reference.
"""

from __future__ import annotations

import statistics

from kiln.bench.ceilings import Ceilings, bandwidth_fractions
from kiln.bench.formulas import decode_tok_s, peak_fraction, prefill_tok_s, ratio, request_tok_s, roofline_tok_s, tflops
from kiln.bench.llm.llm_engine_row import EngineRow, LogitsParity
from kiln.bench.llm.llm_quant import mark_drift
from kiln.bench.row_failure import failure
from kiln.bench.typed_row import UNSET
from kiln.timing import Timing


class LlmRow:
    """One engine (at one quantization)'s figures as they are gathered."""

    def __init__(self, engine: str, quant: str, *, model: str, dtype: str, prompt_len: int, new_tokens: int,
                 batch: int, label_batch: bool = False):
        self.name = (engine if quant == "none" else f"{engine}[{quant}]") + (f" b{batch}" if label_batch else "")
        self.engine_name, self.quant = engine, quant
        self.row = EngineRow(engine=engine, quant=quant, model=model, dtype=dtype, prompt_len=prompt_len,
                             new_tokens=new_tokens, batch=batch, label=self.name)
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
        return self.row.status == "ok"

    def fail(self, exc: BaseException) -> None:
        self.row.status, self.row.reason = failure(exc)
        self.engine = None


def finish_rows(rows: dict[str, LlmRow], plan, ceilings: Ceilings, *, prompt_flops: int | None, weight_bytes: int,
                kv_bytes: dict[int, int], model_bytes: int, parity: LogitsParity | None) -> list[EngineRow]:
    """Every row's reported figures (rows that failed keep their status and what was known).

    `weight_bytes` is what one unquantized decode step reads of the weights (a quantized row carries
    its own), `kv_bytes` what a step reads of the KV cache per batch size (formulas.kv_bytes_per_step),
    `prompt_flops` one prompt's prefill FLOPs (a batch of B prompts does B times as many),
    `model_bytes` the unquantized model's parameters (for peak memory); `parity` (logits against
    HF) goes on the unquantized kiln rows."""
    o, c = plan, ceilings
    for r in rows.values():
        row = r.row
        batch = row.batch
        kiln_row = r.engine_name.startswith("kiln")
        if row.weight_bytes is UNSET:
            row.weight_bytes = weight_bytes
        flops = prompt_flops * batch if prompt_flops is not None else None
        row.update(prefill_flops=flops, kv_bytes_per_step=kv_bytes[batch], **parity.to_json() if parity and kiln_row and r.quant == "none" else {})
        row.step_bytes = row.weight_bytes + row.kv_bytes_per_step
        row.roofline_tok_s = roofline_tok_s(c.bandwidth, row.step_bytes, batch)
        row.spec_roofline_tok_s = roofline_tok_s(c.spec_bytes_per_s, row.step_bytes, batch)
        row_model_bytes = row.get("model_bytes") if kiln_row and row.get("model_bytes") else model_bytes
        if not r.ok or not r.decode:
            continue
        decode_s = statistics.median(r.decode)
        if row.get("prefill_ms"):
            prefill_s = row.prefill_ms / 1e3
            row.update(prefill_tok_s=prefill_tok_s(batch, o.prompt_len, prefill_s),
                       prefill_tflops=tflops(flops, prefill_s),
                       prefill_peak_frac=peak_fraction(flops, prefill_s, c.matmul_flops_per_s),
                       prefill_spec_frac=peak_fraction(flops, prefill_s, c.spec_flops_per_s))
        row.update(
            ttft_ms=statistics.median(r.ttft) * 1e3,
            decode_tok_s=decode_tok_s(batch, o.new_tokens, decode_s),
            token_ms_p50=Timing(tuple(r.intervals)).quantile_s(0.5) * 1e3 if r.intervals else None,
            token_ms_p90=Timing(tuple(r.intervals)).quantile_s(0.9) * 1e3 if r.intervals else None,
            generate_s=statistics.median(r.totals),
            request_tok_s=request_tok_s(batch, o.new_tokens, statistics.median(r.totals)),
            peak_mem_bytes=row_model_bytes + r.held_bytes + max(r.transient) if r.transient else None,
        )
        row.decode_tok_s_per_seq = ratio(row.decode_tok_s, batch)
        figures = {"step_bytes": row.step_bytes}  # bandwidth_fractions fills a dict (gpt-fast's rows too)
        bandwidth_fractions(figures, c, batch, tok_s=row.decode_tok_s)
        row.update(**figures)
    ratios(rows)
    for r in rows.values():
        mark_drift(r.row)
    return [r.row for r in rows.values()]


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def ratios(rows: dict[str, LlmRow]) -> None:
    """Within each batch size: decode (and prefill) speed over the HF baseline, a quantized row's
    decode over its engine's unquantized row, and how many greedy tokens match the reference
    engine's. Across batch sizes: each row's decode step time over the same engine's (and quant's)
    batch-1 step, and how many of its first prompt's greedy tokens match that row's (the first
    prompt is the same at every batch size)."""
    ok = [r for r in rows.values() if r.ok and r.row.get("decode_tok_s")]
    for r in ok:
        r.row.decode_step_ms = 1e3 * r.row.batch / r.row.decode_tok_s
    for batch in sorted({r.row.batch for r in ok}):
        same = {(r.engine_name if r.quant == "none" else f"{r.engine_name}[{r.quant}]"): r
                for r in ok if r.row.batch == batch}
        base = next((same[n] for n in ("hf-compiled", "hf-eager") if n in same), None)
        ref = next((same[n] for n in ("hf-eager", "hf-compiled", "kiln-eager", "kiln-compiled") if n in same), None)
        for r in same.values():
            unquantized = same.get(r.engine_name)
            if r.quant != "none" and unquantized is not None:
                r.row.decode_vs_unquantized = ratio(r.row.decode_tok_s, unquantized.row.decode_tok_s)
            if base is not None:
                r.row.update(vs_hf=base.name, decode_vs_hf=ratio(r.row.decode_tok_s, base.row.decode_tok_s))
                if base.row.get("prefill_ms") and r.row.get("prefill_ms"):
                    r.row.prefill_vs_hf = ratio(base.row.prefill_ms, r.row.prefill_ms)
            if ref is not None and r.tokens and ref.tokens:
                r.row.update(greedy_ref=ref.name, greedy_match=_first_difference(r.tokens[0], ref.tokens[0]))
    single = {(r.engine_name, r.quant): r for r in ok if r.row.batch == 1}
    for r in ok:
        one = single.get((r.engine_name, r.quant))
        if one is None or r is one:
            continue
        r.row.step_vs_batch1 = ratio(r.row.decode_step_ms, one.row.decode_step_ms)
        if r.tokens and one.tokens:
            r.row.greedy_match_batch1 = _first_difference(r.tokens[0], one.tokens[0])
