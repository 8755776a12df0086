"""Running `kiln bench train-llm`: the data and initial weights once, then each row in turn (kiln
recipes and the plain loop in this process, torchtitan in its own), each failing on its own."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kiln.bench import llm_train_bench as tb
from kiln.bench import llm_train_data as data
from kiln.bench import llm_train_peer as peer
from kiln.bench import llm_train_rows as rows_mod
from kiln.bench.formulas import flops_per_token
from kiln.bench.llm_train_plain import write_initial_weights
from kiln.runtime import resolve_device


def _vocab(hf: dict[str, Any]) -> data.Vocab:
    size = int(hf["vocab_size"])
    bos, eos = hf.get("bos_token_id"), hf.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    if not (isinstance(bos, int) and isinstance(eos, int) and bos != eos and max(bos, eos) < size):
        bos, eos = size - 2, size - 1
    return data.Vocab(size, bos, eos)


def _base_row(spec: tb.RowSpec) -> dict[str, Any]:
    return {"row": spec.name, "kind": spec.kind, "status": "ok", "reason": None}


def _in_process(spec: tb.RowSpec, opts: tb.TrainLlmOptions, ctx: dict[str, Any], batches) -> dict[str, Any]:
    device = ctx["device"]
    if spec.kind == "plain":
        result = rows_mod.measure_row(lambda stack: rows_mod.plain_step(ctx["weights_dir"], device, opts.hyper,
                                                                   opts.precision, opts.plain_compile),
                                      batches, device)
    else:
        overrides = [*ctx["base_overrides"], *spec.overrides]
        result = rows_mod.measure_row(lambda stack: rows_mod.kiln_step(overrides, stack), batches, device)
    row = _base_row(spec)
    row.update(status=result["status"], reason=result["reason"], params=result["params"], config=result["config"])
    if spec.kind == "kiln":
        row["overrides"] = list(spec.overrides)
    run = result["run"]
    if run is not None:
        tb.figures(row, run.step_s, opts.warmup, ctx["tokens_per_step"], ctx["flops_per_token"], ctx["spec"],
                   ctx["matmul"])
        row.update(first_step_s=run.first_step_s, losses=run.losses, loss_first=run.losses[0],
                   loss_last=run.losses[-1], peak_mem_bytes=run.peak_mem_bytes)
        if not all(np.isfinite(run.losses)):
            row.update(status="error", reason="non-finite loss")
    return row


def _torchtitan(spec: tb.RowSpec, opts: tb.TrainLlmOptions, ctx: dict[str, Any], batches,
                timeout_s: float) -> dict[str, Any]:
    corpus: data.Corpus = ctx["corpus"]
    h = opts.hyper
    mixed = {"bf16-mixed": "bfloat16", "fp32": "float32"}.get(opts.precision)
    row = _base_row(spec)
    if mixed is None:
        row.update(status="skipped", reason=f"torchtitan has no {opts.precision} policy (bf16-mixed or fp32)")
        return row
    job = peer.PeerJob(workdir=ctx["data_dir"] / "torchtitan", tokenizer_dir=corpus.tokenizer_dir,
                       dataset_dir=corpus.dataset_dir, weights_dir=ctx["weights_dir"], batch=opts.batch,
                       seq_len=opts.seq_len, steps=opts.steps, seed=opts.seed, lr=h.lr, betas=h.betas, eps=h.eps,
                       weight_decay=h.weight_decay, warmup_steps=h.warmup_steps, max_norm=h.max_norm,
                       mixed_precision=mixed)
    result = peer.run(job, opts.hf, [*opts.torchtitan_overrides, *spec.overrides], timeout_s)
    row.update(status=result["status"], reason=result.get("reason"), config=result.get("config"),
               peer=result.get("info"), wall_s=result.get("wall_s"), log=result.get("log"))
    steps = result.get("per_step") or []
    if steps:
        step_s = [s["time_metrics/end_to_end(s)"] for s in steps[1:]]
        tb.figures(row, step_s, opts.warmup, ctx["tokens_per_step"], ctx["flops_per_token"], ctx["spec"],
                   ctx["matmul"])
        losses = [s["loss_metrics/global_avg_loss"] for s in steps]
        gib = max(s.get("memory/max_active(GiB)", 0.0) for s in steps)
        row.update(first_step_s=steps[0]["time_metrics/end_to_end(s)"], losses=losses, loss_first=losses[0],
                   loss_last=losses[-1], peak_mem_bytes=int(gib * 2**30),
                   peak_reserved_bytes=int(max(s.get("memory/max_reserved(GiB)", 0.0) for s in steps) * 2**30))
    info = result.get("info") or {}
    if info.get("params"):
        row["params"] = info["params"]
    first = ctx["data_dir"] / "torchtitan" / "first_batch.npy"
    if first.exists():
        theirs = np.load(first)
        ours = np.stack([batches[0][0].cpu().numpy(), batches[0][1].cpu().numpy()])
        row["tokens_match"] = bool(theirs.shape == ours.shape and np.array_equal(theirs, ours))
        if not row["tokens_match"]:
            row["reason"] = (row.get("reason") or "") + " first batch differs from the bench's"
    return row


def run(opts: tb.TrainLlmOptions, out: Path, log: Callable[[str], None] = print,
        progress: Callable[[list[dict], dict], None] | None = None) -> tuple[list[dict], dict]:
    """All rows; returns (rows, context for the report). `progress(rows, context)` runs after each
    row (the CLI writes the results so far: a call cut short keeps every finished row)."""
    start = time.monotonic()
    device = resolve_device(opts.device)
    data_dir = (opts.data_dir or out / "data").resolve()  # the peer runs in its own directory
    spec_flops, spec_source = tb.spec_peak(device, opts.precision)
    matmul = tb.matmul_peak(device, opts.precision)
    log(f"matmul peak {matmul / 1e12:.1f} TFLOP/s; spec {spec_source}")
    vocab = _vocab(opts.hf)
    corpus = data.build_corpus(data_dir / "corpus", vocab, seed=opts.seed,
                               min_tokens=data.stream_tokens_needed(opts.steps, opts.batch, opts.seq_len))
    stream = data.load_stream(corpus.tokens_path)
    batches = data.batches(stream, steps=opts.steps, batch=opts.batch, seq_len=opts.seq_len, device=device)
    log(f"corpus: {corpus.documents} documents, {corpus.n_tokens} tokens, vocabulary {vocab.size} ({data_dir})")
    # One transformers initialisation for every row: kiln's rows load it as kiln train loads a model
    # directory (also faster than a random init on the host for billions of parameters).

    weights_dir = write_initial_weights(opts.hf, data_dir / "init", seed=opts.seed, device=device)
    rows_mod.release(device)
    log(f"initial weights: {weights_dir}")
    model_name = f"{opts.kiln_family}:{weights_dir}"
    ctx: dict[str, Any] = {
        "device": device, "data_dir": data_dir, "corpus": corpus, "weights_dir": weights_dir,
        "tokens_per_step": opts.batch * opts.seq_len, "flops_per_token": flops_per_token(opts.hf, opts.seq_len),
        "spec": spec_flops, "spec_source": spec_source, "matmul": matmul,
        "base_overrides": tb.base_overrides(opts, model_name, corpus.tokens_path, device)}
    results = []
    for spec in opts.rows:
        left = tb.deadline_left(start, opts.deadline_s)
        if spec.invalid is not None:
            row = {**_base_row(spec), "status": "skipped", "reason": spec.invalid, "overrides": list(spec.overrides)}
        elif left is not None and left <= 0:
            row = {**_base_row(spec), "status": "skipped", "reason": f"not started: past --deadline-s {opts.deadline_s:g}"}
        else:
            log(f"row {spec.name} ({spec.kind}) ...")
            t0 = time.monotonic()
            if spec.kind == "torchtitan":
                timeout = opts.torchtitan_timeout_s if left is None else min(opts.torchtitan_timeout_s, left + 60)
                row = _torchtitan(spec, opts, ctx, batches, timeout)
            else:
                row = _in_process(spec, opts, ctx, batches)
            row["wall_s"] = time.monotonic() - t0
        results.append(row)
        log(summary_line(row))
        if progress is not None:
            ctx.update(elapsed_s=time.monotonic() - start, vocab=vocab, corpus_tokens=corpus.n_tokens,
                       corpus_documents=corpus.documents)
            progress(results, ctx)
    matmul_end = tb.matmul_peak(device, opts.precision)
    tb.compare(results, opts.baseline, opts.loss_tol)
    ctx.update(matmul_end=matmul_end, elapsed_s=time.monotonic() - start, vocab=vocab, corpus_tokens=corpus.n_tokens,
               corpus_documents=corpus.documents)
    return results, ctx


def summary_line(row: dict[str, Any]) -> str:
    head = f"row {row['row']}: {row['status']}"
    if row.get("tokens_per_s"):
        head += (f" {row['step_ms']:.1f} ms/step, {row['tokens_per_s']:,.0f} tok/s"
                 + (f", MFU {row['mfu_spec']:.1%} of spec" if row.get("mfu_spec") else "")
                 + (f", loss {row['loss_first']:.4f} -> {row['loss_last']:.4f}" if row.get("loss_last") else ""))
    if row.get("reason"):
        head += f": {row['reason']}"
    return head
