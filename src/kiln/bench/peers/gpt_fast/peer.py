"""gpt-fast as a peer of `kiln bench llm` (kiln.bench.peers.interface): its rows run after kiln's are
timed, on the same weights, and their figures are set beside kiln's."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kiln.bench.ceilings import bandwidth_fractions
from kiln.bench.formulas import ratio
from kiln.bench.llm.llm_peer_context import LlmPeerContext, LlmPeerRequest
from kiln.bench.peers.gpt_fast.flags import check_flags
from kiln.bench.peers.gpt_fast.process import Prepared, prepare, run_rows
from kiln.bench.peers.gpt_fast.row import ENGINE, GptFastRow
from kiln.bench.peers.interface import Bench

if TYPE_CHECKING:
    from kiln.bench.llm.llm_options import LlmBenchPlan


def _base(o, batch: int) -> dict[str, Any]:
    return {"model": o.model, "dtype": o.dtype, "batch": batch, "prompt_len": o.prompt_len, "new_tokens": o.new_tokens}


class GptFastPeer:
    name = ENGINE
    bench: Bench = "llm"
    row_settings: str | None = None

    def check(self, request: LlmPeerRequest) -> dict[str, Any]:
        """The plan's gpt-fast fields (kiln.bench.llm.llm_options builds the plan with them)."""
        return check_flags(request.opts, request.config)

    def asked(self, plan: LlmBenchPlan) -> bool:
        return bool(plan.gpt_fast)

    def prepare(self, ctx: LlmPeerContext) -> Prepared | None:
        """gpt-fast's checkpoints (bf16, and int4 through its quantize.py), written before kiln's rows
        are timed so that only its generation runs after them; None without --gpt-fast or a model."""
        o = ctx.plan
        if not self.asked(o) or ctx.kiln_model is None:
            return None
        return prepare(ctx.kiln_model, Path(o.gpt_fast), quants=o.gpt_fast_quants, group_size=o.gpt_fast_group_size,
                       timeout_s=o.gpt_fast_timeout_s, log=ctx.log)

    def run(self, prepared: Prepared | None, ctx: LlmPeerContext) -> list[GptFastRow]:
        """gpt-fast's rows, one per quant and batch size (its `batch_size`), after kiln's are timed (its
        processes share the GPU with this one's models, which sit idle meanwhile); the checkpoints are
        removed after."""
        o = ctx.plan
        if not self.asked(o):
            return []
        several = len(o.batches) > 1
        if prepared is None:
            return [GptFastRow(quant=q, **_base(o, b), status="skipped", reason="kiln's model could not be built")
                    for b in o.batches for q in o.gpt_fast_quants]
        rows = []
        try:
            gc.collect()
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
            started = time.perf_counter()
            for batch in o.batches:  # the timeout is for all of gpt-fast's rows together
                budget = o.gpt_fast_timeout_s - (time.perf_counter() - started)
                if o.end_by_s is not None:
                    budget = min(budget, o.end_by_s - (time.perf_counter() - ctx.started))
                found = run_rows(prepared, quants=o.gpt_fast_quants, prompt_len=o.prompt_len, new_tokens=o.new_tokens,
                                 samples=max(o.repeats, 2), group_size=o.gpt_fast_group_size, device=str(ctx.device),
                                 timeout_s=budget, batch=batch, log=ctx.log, known=_base(o, batch))
                for row in found:
                    label = ENGINE if row.quant == "none" else f"{ENGINE}[{row.quant}]"
                    rows.append(row.update(label=label + (f" b{batch}" if several else "")))
        finally:
            prepared.close()
        return rows

    def rows(self, found: list[GptFastRow], ctx: LlmPeerContext) -> list[GptFastRow]:
        """Bandwidth fractions of the peer's rows (from their whole-request tokens/s: gpt-fast
        reports no decode-only figure; the bytes per step include the KV cache as kiln's rows do) and
        each kiln row's speed against the peer at its quant and batch size."""
        for row in found:
            if row.status == "ok" and row.get("weight_bytes"):
                kv = ctx.kv_bytes[row.batch]
                figures = {"step_bytes": row.weight_bytes + kv}
                bandwidth_fractions(figures, ctx.ceilings, row.batch, tok_s=row.request_tok_s)
                row.update(roofline_basis="request_tok_s", kv_bytes_per_step=kv, **figures)
        peer = {(row.quant, row.batch): row for row in found if row.status == "ok" and row.get("request_tok_s")}
        for r in ctx.bench_rows.values():
            other = peer.get(("int4" if r.quant.startswith("int4") else r.quant, r.row.batch))
            if other is not None and r.row.get("request_tok_s"):
                r.row.against_peers.update(vs_gpt_fast=f"gpt-fast[{other.quant}]",
                                           request_vs_gpt_fast=ratio(r.row.request_tok_s, other.request_tok_s))
        return found


GPT_FAST = GptFastPeer()
