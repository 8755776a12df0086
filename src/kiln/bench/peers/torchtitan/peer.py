"""torchtitan as a peer of `kiln bench train-llm` (kiln.bench.peers.interface): the bench's job written
for it (job.py), run in its own process through the launcher shipped beside this module, its
per-step metrics turned into the bench's figures, and its first batch checked against the bench's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kiln.bench.peers.interface import Bench
from kiln.bench.peers.torchtitan import job_file as titan
from kiln.bench.train_llm.llm_train_result import RowRun, TrainRow, set_figures
from kiln.errors import ConfigError

MIXED = {"bf16-mixed": "bfloat16", "fp32": "float32"}
"""The bench's precision -> torchtitan's mixed_precision_param."""


@dataclass(frozen=True)
class TitanPrepared:
    """The job torchtitan runs, or why it cannot run this bench's rows."""

    job: titan.PeerJob | None
    skipped: str | None = None

    def close(self) -> None:
        return None


class TorchtitanPeer:
    name = "torchtitan"
    bench: Bench = "train-llm"
    row_settings: str | None = "SECTION.KEY=VALUE keys of torchtitan's job"

    def check(self, opts) -> None:
        """--torchtitan-set entries (kiln.bench.train_llm.llm_train_bench.TrainLlmOptions.torchtitan_overrides)
        and the settings of each --peer-recipe row of torchtitan's (applied after them) are SECTION.KEY=VALUE."""
        sets = [("--torchtitan-set", t) for t in opts.torchtitan_overrides]
        sets += [("--peer-recipe", t) for row in opts.rows if row.kind == self.name for t in row.overrides]
        for flag, text in sets:
            key, sep, _ = text.partition("=")
            if not sep or "." not in key:
                raise ConfigError(flag, f"expected SECTION.KEY=VALUE, got {text!r}")

    def prepare(self, run: RowRun) -> TitanPrepared:
        opts, ctx = run.opts, run.ctx
        mixed = MIXED.get(opts.precision)
        if mixed is None:
            return TitanPrepared(None, f"torchtitan has no {opts.precision} policy (bf16-mixed or fp32)")
        h = opts.hyper
        job = titan.PeerJob(workdir=ctx.data_dir / run.spec.name, tokenizer_dir=ctx.corpus.tokenizer_dir,
                            dataset_dir=ctx.corpus.dataset_dir, weights_dir=ctx.weights_dir, batch=opts.batch,
                            seq_len=opts.seq_len, steps=opts.steps, seed=opts.seed, lr=h.lr, betas=h.betas, eps=h.eps,
                            weight_decay=h.weight_decay, warmup_steps=h.warmup_steps, max_norm=h.max_norm,
                            mixed_precision=mixed, nproc=ctx.nproc,
                            activation_checkpoint="selective" if ctx.nproc > 1 else "none")
        return TitanPrepared(job)

    def run(self, prepared: TitanPrepared, run: RowRun) -> list[TrainRow]:
        opts, ctx, spec = run.opts, run.ctx, run.spec
        row = TrainRow(spec.name, spec.kind)
        if spec.overrides:  # a --peer-recipe row: its settings of torchtitan's job
            row.overrides = list(spec.overrides)
        if ctx.nproc > 1:
            row.nproc = ctx.nproc
        if prepared.job is None:
            row.status, row.reason = "skipped", prepared.skipped
            return [row]
        left = run.deadline_left_s
        timeout = opts.torchtitan_timeout_s if left is None else min(opts.torchtitan_timeout_s, left + 60)
        result = titan.run(prepared.job, opts.hf, [*opts.torchtitan_overrides, *spec.overrides], timeout)
        row.status, row.reason, row.config = result["status"], result.get("reason"), result.get("config")
        row.peer, row.wall_s, row.log = result.get("info"), result.get("wall_s"), result.get("log")
        steps = result.get("per_step") or []
        if steps:
            set_figures(row, [s["time_metrics/end_to_end(s)"] for s in steps[1:]], ctx, opts.warmup)
            losses = [s["loss_metrics/global_avg_loss"] for s in steps]
            # Each rank records its own steps: the peak is the fullest rank's.
            every = [s for rank in result.get("per_rank") or [steps] for s in rank] or steps
            gib = max(s.get("memory/max_active(GiB)", 0.0) for s in every)
            row.first_step_s, row.losses = steps[0]["time_metrics/end_to_end(s)"], losses
            row.loss_first, row.loss_last, row.peak_mem_bytes = losses[0], losses[-1], int(gib * 2**30)
            row.peak_reserved_bytes = int(max(s.get("memory/max_reserved(GiB)", 0.0) for s in every) * 2**30)
        info = result.get("info") or {}
        if info.get("params"):
            row.params = info["params"]
        first = prepared.job.workdir / "first_batch.npy"
        if first.exists():
            theirs = np.load(first)
            ours = np.stack([run.batches[0][0].cpu().numpy(), run.batches[0][1].cpu().numpy()])
            row.tokens_match = bool(theirs.shape == ours.shape and np.array_equal(theirs, ours))
            if not row.tokens_match:
                row.reason = (row.reason or "") + " first batch differs from the bench's"
        return [row]

    def rows(self, found: list[TrainRow], run: RowRun) -> list[TrainRow]:
        return found


TORCHTITAN = TorchtitanPeer()
