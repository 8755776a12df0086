"""Peer engines in `kiln bench llm`: gpt-fast's rows (kiln.bench.peers.gpt_fast) run after kiln's
are timed, on the same weights, and the figures that put them side by side."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

import torch

from kiln.bench.ceilings import bandwidth_fractions
from kiln.bench.formulas import ratio
from kiln.bench.peers.gpt_fast import ENGINE, prepare, run_rows


def _base(o, batch: int) -> dict[str, Any]:
    return {"model": o.model, "dtype": o.dtype, "batch": batch, "prompt_len": o.prompt_len, "new_tokens": o.new_tokens}


def prepare_peers(bench):
    """gpt-fast's checkpoints (bf16, and int4 through its quantize.py), written before kiln's rows
    are timed so that only its generation runs after them; None without --gpt-fast or a model."""
    o = bench.opts
    if not o.gpt_fast or bench.kiln_model is None:
        return None
    return prepare(bench.kiln_model, Path(o.gpt_fast), quants=o.gpt_fast_quants, group_size=o.gpt_fast_group_size,
                   timeout_s=o.gpt_fast_timeout_s, log=bench.log)


def run_peers(bench, prep) -> list[dict[str, Any]]:
    """gpt-fast's rows, one per quant and batch size (its `batch_size`), after kiln's are timed (its
    processes share the GPU with this one's models, which sit idle meanwhile); the checkpoints are
    removed after."""
    o = bench.opts
    if not o.gpt_fast:
        return []
    several = len(o.batches) > 1
    if prep is None:
        return [{"engine": ENGINE, "quant": q, **_base(o, b), "status": "skipped",
                 "reason": "kiln's model could not be built"} for b in o.batches for q in o.gpt_fast_quants]
    rows = []
    try:
        gc.collect()
        if bench.device.type == "cuda":
            torch.cuda.empty_cache()
        started = time.perf_counter()
        for batch in o.batches:  # the timeout is for all of gpt-fast's rows together
            budget = o.gpt_fast_timeout_s - (time.perf_counter() - started)
            if o.end_by_s is not None:
                budget = min(budget, o.end_by_s - (time.perf_counter() - bench.started))
            found = run_rows(prep, quants=o.gpt_fast_quants, prompt_len=o.prompt_len, new_tokens=o.new_tokens,
                             samples=max(o.repeats, 2), group_size=o.gpt_fast_group_size, device=str(bench.device),
                             timeout_s=budget, batch=batch, log=bench.log)
            for row in found:
                label = ENGINE if row["quant"] == "none" else f"{ENGINE}[{row['quant']}]"
                rows.append({**_base(o, batch), **row, "label": label + (f" b{batch}" if several else "")})
    finally:
        prep.close()
    return rows


def finish_peers(bench, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bandwidth fractions of the peers' rows (from their whole-request tokens/s: gpt-fast
    reports no decode-only figure; the bytes per step include the KV cache as kiln's rows do) and
    each kiln row's speed against the peer at its quant and batch size."""
    c = bench.ceilings
    kv = bench.kv_bytes()
    for row in rows:
        if row.get("status") == "ok" and row.get("weight_bytes"):
            row["roofline_basis"] = "request_tok_s"
            row["kv_bytes_per_step"] = kv[row["batch"]]
            row["step_bytes"] = row["weight_bytes"] + row["kv_bytes_per_step"]
            bandwidth_fractions(row, c, row["batch"], tok_s=row["request_tok_s"])
    peer = {(row["quant"], row["batch"]): row for row in rows if row.get("status") == "ok" and row.get("request_tok_s")}
    for r in bench.rows.values():
        other = peer.get(("int4" if r.quant.startswith("int4") else r.quant, r.row["batch"]))
        if other is not None and r.row.get("request_tok_s"):
            r.row.update(vs_gpt_fast=f"gpt-fast[{other['quant']}]",
                         request_vs_gpt_fast=ratio(r.row["request_tok_s"], other["request_tok_s"]))
    return rows
