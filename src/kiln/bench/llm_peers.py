"""Peer engines in `kiln bench llm`: gpt-fast's rows (kiln.bench.peers.gpt_fast) run after kiln's
are timed, on the same weights, and the figures that put them side by side."""

from __future__ import annotations

import gc
import time
from typing import Any

import torch

from kiln.bench.ceilings import bandwidth_fractions
from kiln.bench.formulas import ratio


def run_peers(bench) -> list[dict[str, Any]]:
    """gpt-fast's rows, after kiln's are timed (its processes share the GPU with this one's
    models, which sit idle meanwhile)."""
    from pathlib import Path

    from kiln.bench.peers.gpt_fast import ENGINE, run_rows

    o = bench.opts
    if not o.gpt_fast:
        return []
    base = {"model": o.model, "dtype": o.dtype, "batch": o.batch, "prompt_len": o.prompt_len,
            "new_tokens": o.new_tokens}
    elapsed = time.perf_counter() - bench.started
    if bench.kiln_model is None or (o.deadline_s is not None and elapsed > o.deadline_s):
        why = ("kiln's model could not be built" if bench.kiln_model is None
               else f"not started: the run's --deadline-s {o.deadline_s:g} had passed ({elapsed:.0f} s)")
        return [{"engine": ENGINE, "quant": q, **base, "status": "skipped", "reason": why} for q in o.gpt_fast_quants]
    gc.collect()
    if bench.device.type == "cuda":
        torch.cuda.empty_cache()
    budget = o.gpt_fast_timeout_s
    if o.end_by_s is not None:
        budget = min(budget, o.end_by_s - (time.perf_counter() - bench.started))
    rows = run_rows(bench.kiln_model, Path(o.gpt_fast), quants=o.gpt_fast_quants, prompt_len=o.prompt_len,
                    new_tokens=o.new_tokens, samples=max(o.repeats, 2), group_size=o.gpt_fast_group_size,
                    device=str(bench.device), timeout_s=budget, log=bench.log)
    return [{**base, **row} for row in rows]


def finish_peers(bench, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bandwidth fractions of the peers' rows (from their whole-request tokens/s: gpt-fast
    reports no decode-only figure) and each kiln row's speed against the peer at its quant."""
    c = bench.ceilings
    for row in rows:
        if row.get("status") == "ok" and row.get("weight_bytes"):
            row["roofline_basis"] = "request_tok_s"
            bandwidth_fractions(row, c, bench.opts.batch, tok_s=row["request_tok_s"])
    peer = {row["quant"]: row for row in rows if row.get("status") == "ok" and row.get("request_tok_s")}
    for r in bench.rows.values():
        other = peer.get("int4" if r.quant.startswith("int4") else r.quant)
        if other is not None and r.row.get("request_tok_s"):
            r.row.update(vs_gpt_fast=f"gpt-fast[{other['quant']}]",
                         request_vs_gpt_fast=ratio(r.row["request_tok_s"], other["request_tok_s"]))
    return rows
