"""The plain transformers loop (plain_loop.py) as a peer of `kiln bench train-llm`
(kiln.bench.peers.interface): trained in this process from the bench's initial weights on its
batches, timed as kiln's rows are; at --nproc-per-node N > 1, the hand-written FSDP2 loop
(plain_fsdp.py) on N ranks."""

from __future__ import annotations

import torch

from kiln.bench.peers.interface import Bench, NothingPrepared, PeerDefaults
from kiln.bench.peers.plain.plain_fsdp_row import plain_fsdp_row
from kiln.bench.peers.plain.plain_loop import plain_runner
from kiln.bench.train_llm.llm_train_result import RowRun, TrainRow
from kiln.bench.train_llm.llm_train_rows import in_process_row


class PlainPeer(PeerDefaults):
    """No options of its own, nothing to prepare: the loop takes the bench's options."""

    name = "plain"
    bench: Bench = "train-llm"

    def run(self, prepared: NothingPrepared, run: RowRun) -> list[TrainRow]:
        opts, ctx = run.opts, run.ctx
        if ctx.nproc > 1:  # the hand-written FSDP2 loop on the bench's ranks
            return [plain_fsdp_row(run)]
        autocast = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(opts.precision)
        return [in_process_row(run, lambda stack: plain_runner(ctx.weights_dir, ctx.device, opts.hyper,
                                                               autocast_dtype=autocast, compile=opts.plain_compile))]


PLAIN = PlainPeer()
