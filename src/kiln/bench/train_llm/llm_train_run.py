"""Running `kiln bench train-llm`: the data and initial weights once (TrainContext), then each row
in turn through its row kind (kiln's recipes, or a train-llm peer of kiln.bench.peers.table: the
plain loop in this process, torchtitan in its own), each failing on its own. At several ranks
(--nproc-per-node) every row runs under torchrun, reading one shard of the corpus per rank."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiln.bench.formulas import flops_per_token
from kiln.bench.peers import table as registry
from kiln.bench.peers.interface import Peer
from kiln.bench.peers.plain.plain_loop import write_initial_weights
from kiln.bench.train_llm import llm_train_bench as tb
from kiln.bench.train_llm import llm_train_data as data
from kiln.bench.train_llm import llm_train_rows as rows_mod
from kiln.bench.train_llm.llm_train_kiln import KILN_ROWS
from kiln.bench.train_llm.llm_train_result import RowRun, TrainContext, TrainRow, compare
from kiln.runtime import resolve_device


def _vocab(hf: dict[str, Any]) -> data.Vocab:
    size = int(hf["vocab_size"])
    bos, eos = hf.get("bos_token_id"), hf.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    if not (isinstance(bos, int) and isinstance(eos, int) and bos != eos and max(bos, eos) < size):
        bos, eos = size - 2, size - 1
    return data.Vocab(size, bos, eos)


def row_kind(kind: str) -> Peer[Any, RowRun, Any, TrainRow]:
    """The object that runs rows of `kind`: kiln's recipes, or the train-llm peer of that name."""
    return KILN_ROWS if kind == KILN_ROWS.name else registry.peer("train-llm", kind)


def run_row(run: RowRun) -> TrainRow:
    """One row through its kind's steps (prepare, run, rows); what it prepared is closed after."""
    kind = row_kind(run.spec.kind)
    prepared = kind.prepare(run)
    try:
        return kind.rows(kind.run(prepared, run), run)[0]
    finally:
        prepared.close()


def run(opts: tb.TrainLlmOptions, out: Path, log: Callable[[str], None] = print,
        progress: Callable[[list[dict], TrainContext], None] | None = None) -> tuple[list[dict], TrainContext]:
    """All rows, as results.json's rows, and the context for the report. `progress(rows, context)` runs
    after each row (the CLI writes the results so far: a call cut short keeps every finished row)."""
    start = time.monotonic()
    registry.check_peers("train-llm", opts)  # before any work
    device = resolve_device(opts.device)
    data_dir = (opts.data_dir or out / "data").resolve()  # the peer runs in its own directory
    spec_flops, spec_source = tb.spec_peak(device, opts.precision)
    matmul = tb.matmul_peak(device, opts.precision)
    log(f"matmul peak {matmul / 1e12:.1f} TFLOP/s; spec {spec_source}")
    vocab = _vocab(opts.hf)
    corpus = data.build_corpus(data_dir / "corpus", vocab, seed=opts.seed, shards=opts.nproc,
                               min_tokens=data.stream_tokens_needed(opts.steps, opts.batch, opts.seq_len))
    stream = data.load_stream(corpus.tokens_path)
    # At several ranks the batches stay on the host: only the launched rows' files are made of them.
    batches = data.batches(stream, steps=opts.steps, batch=opts.batch, seq_len=opts.seq_len,
                           device=device if opts.nproc == 1 else "cpu", shard_tokens=corpus.shard_tokens)
    rows_dir = data_dir / "rows" if opts.nproc > 1 else None
    rank_files = data.write_rank_files(batches, opts.nproc, rows_dir) if rows_dir is not None else None
    log(f"corpus: {corpus.documents} documents, {corpus.n_tokens} tokens, vocabulary {vocab.size} ({data_dir})")
    # One transformers initialisation for every row: kiln's rows load it as kiln train loads a model
    # directory (also faster than a random init on the host for billions of parameters).

    weights_dir = write_initial_weights(opts.hf, data_dir / "init", seed=opts.seed, device=device)
    rows_mod.release(device)
    log(f"initial weights: {weights_dir}")
    model_name = f"{opts.kiln_family}:{weights_dir}"
    ctx = TrainContext(device=device, data_dir=data_dir, corpus=corpus, vocab=vocab, weights_dir=weights_dir,
                       tokens_per_step=opts.nproc * opts.batch * opts.seq_len, nproc=opts.nproc,
                       rows_dir=rows_dir, rank_files=rank_files,
                       flops_per_token=flops_per_token(opts.hf, opts.seq_len), spec=spec_flops,
                       spec_source=spec_source, matmul=matmul,
                       base_overrides=tb.base_overrides(opts, model_name, corpus.tokens_path, device))
    results: list[TrainRow] = []
    for spec in opts.rows:
        left = tb.deadline_left(start, opts.deadline_s)
        if spec.invalid is not None:
            row = TrainRow(spec.name, spec.kind, status="skipped", reason=spec.invalid, overrides=list(spec.overrides))
        elif left is not None and left <= 0:
            row = TrainRow(spec.name, spec.kind, status="skipped",
                           reason=f"not started: past --deadline-s {opts.deadline_s:g}")
        else:
            log(f"row {spec.name} ({spec.kind}) ...")
            t0 = time.monotonic()
            row = run_row(RowRun(spec, opts, ctx, batches, left))
            row.wall_s = time.monotonic() - t0
        results.append(row)
        log(summary_line(row))
        if progress is not None:
            ctx.elapsed_s = time.monotonic() - start
            progress([r.to_json() for r in results], ctx)
    ctx.matmul_end = tb.matmul_peak(device, opts.precision)
    compare(results, opts.baseline, opts.loss_tol)
    ctx.elapsed_s = time.monotonic() - start
    return [r.to_json() for r in results], ctx


def summary_line(row: TrainRow) -> str:
    head = f"row {row.row}: {row.status}"
    if row.get("tokens_per_s"):
        head += (f" {row.step_ms:.1f} ms/step, {row.tokens_per_s:,.0f} tok/s"
                 + (f" ({row.tokens_per_s_per_gpu:,.0f} per GPU)" if row.get("nproc") else "")
                 + (f", MFU {row.mfu_spec:.1%} of spec" if row.get("mfu_spec") else "")
                 + (f", loss {row.loss_first:.4f} -> {row.loss_last:.4f}" if row.get("loss_last") else ""))
    if row.reason:
        head += f": {row.reason}"
    return head
