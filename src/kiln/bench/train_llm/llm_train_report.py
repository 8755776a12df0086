"""What `kiln bench train-llm` writes: results.json (env, config, one row per recipe with its
per-step losses and exact config) and results.md (the table, the shared setup, the checks)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from kiln.bench.formulas import flops_params
from kiln.bench.results import markdown_table, write_results
from kiln.bench.train_llm.llm_train_result import TrainContext

COLUMNS = ["row", "kind", "status", "step_ms", "tokens_per_s", "tokens_per_s_per_gpu", "tflops", "mfu_spec",
           "mfu_matmul", "peak_mem_gib", "plan_gib", "loss_first", "loss_last", "loss_tail", "loss_tail_diff_vs_ref", "loss_check", "speedup_vs_ref", "first_step_s", "reason"]


def _table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        shown = dict(r)
        for key, gib in (("peak_mem_bytes", "peak_mem_gib"), ("plan_bytes", "plan_gib")):
            if r.get(key) is not None:
                shown[gib] = r[key] / 2**30
        for key in ("mfu_spec", "mfu_matmul"):
            if r.get(key) is not None:
                shown[key] = f"{r[key]:.1%}"
        for key in ("tokens_per_s", "tokens_per_s_per_gpu"):
            if r.get(key) is not None:
                shown[key] = f"{r[key]:,.0f}"
        out.append(shown)
    return out


def _setup(ctx: TrainContext, rows: list[dict[str, Any]], opts) -> list[str]:
    h = opts.hyper
    fpt = ctx.flops_per_token
    lines = [
        f"- model {opts.model} ({'untied' if opts.hf.get('tie_word_embeddings') is False else 'as configured'}), "
        f"sequence {opts.seq_len}, batch {opts.batch}"
        + (f" per rank x {opts.nproc} ranks (global batch {opts.batch * opts.nproc})" if opts.nproc > 1 else "")
        + f" ({ctx.tokens_per_step:,} tokens/step), {opts.steps} steps "
        f"per row, the first {opts.warmup} left out of the timing; base precision {opts.precision}",
        f"- every row: AdamW lr {h.lr:g} betas {h.betas} eps {h.eps:g} weight decay {h.weight_decay:g}, "
        f"linear warm-up over {h.warmup_steps} steps then constant, gradient clipping at {h.max_norm:g}; "
        f"seed {opts.seed}" + ("; initial weights from one transformers initialisation "
                               f"({ctx.weights_dir})" if ctx.weights_dir else ""),
        f"- data: {ctx.corpus.documents} documents, {ctx.corpus.n_tokens:,} tokens of a synthetic word-level "
        f"language, one tokenizer of {ctx.vocab.size:,} entries for every row (BOS {ctx.vocab.bos_id}, "
        f"EOS {ctx.vocab.eos_id}); batch i holds sequences iB..iB+B-1 of {opts.seq_len}+1 tokens cut in order",
        f"- model FLOPs/token: 6 x {flops_params(opts.hf):,} multiplying parameters + 12 x layers x hidden x seq = "
        f"{fpt:,} (attention counted as torchtitan counts it: no causal halving, no recompute)",
        f"- MFU of spec: against {ctx.spec / 1e12:.1f} TFLOP/s ({ctx.spec_source})" if ctx.spec else
        f"- MFU of spec: no datasheet peak ({ctx.spec_source})",
        f"- MFU of matmul: against a matmul measured here (bf16 on CUDA), {ctx.matmul / 1e12:.1f} TFLOP/s before the rows"
        + (f" and {ctx.matmul_end / 1e12:.1f} after" if ctx.matmul_end else " (the call has not ended)"),
    ]
    if opts.nproc > 1:
        lines.append(f"- {opts.nproc} ranks per row: the corpus is {opts.nproc} shards of equal document counts; "
                     "rank r trains on shard r (torchtitan's contiguous split of the documents; kiln's and the plain "
                     "loop's DistributedSampler over the same sequences, unshuffled); MFU against "
                     f"{opts.nproc} x one GPU's peaks; tokens/s in all and per GPU; peak memory of the fullest rank")
    for r in rows:
        if r.get("tokens_match") is not None:
            lines.append(f"- {r['row']}: its own tokenizer and dataloader's first batch "
                         f"{'equals' if r['tokens_match'] else 'DIFFERS FROM'} the bench's first batch")
    return lines + [f"- {n}" for n in opts.notes]


def write_report(out: Path, rows: list[dict[str, Any]], ctx: TrainContext, opts, *, env: dict,
                 command: str) -> dict[str, Any]:
    """results.json and results.md of the rows so far (results.json's rows: TrainRow.to_json())."""
    config = {"bench": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(opts).items()},
              "flops_per_token": ctx.flops_per_token, "tokens_per_step": ctx.tokens_per_step,
              "spec_flops": ctx.spec, "spec_source": ctx.spec_source, "matmul_flops": ctx.matmul,
              "matmul_flops_end": ctx.matmul_end, "elapsed_s": ctx.elapsed_s}
    title = f"kiln bench train-llm: {opts.model}, seq {opts.seq_len}, batch {opts.batch}, {opts.steps} steps"
    notes = "## Setup\n\n" + "\n".join(_setup(ctx, rows, opts))
    json_path = write_results(out, env=env, config=config, results=rows, columns=COLUMNS, title=title,
                              command=command, sections=[("Rows", _table_rows(rows), COLUMNS)], notes=notes)
    return {"json": json_path, "md": out / "results.md", "table": markdown_table(_table_rows(rows), COLUMNS)}
