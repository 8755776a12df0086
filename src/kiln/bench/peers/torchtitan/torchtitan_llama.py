"""Run torchtitan (the peer, installed separately, never copied) on a Llama shape it has no flavor
for, as `kiln bench train-llm`'s torchtitan row (kiln.bench.peers.torchtitan.job_file starts it by its path:
it ships inside the package and imports nothing of kiln). Under torchrun, one rank:

    python -m torch.distributed.run --standalone --nproc-per-node 1 .../kiln/bench/peers/torchtitan/torchtitan_llama.py \
        --kiln-flavor NAME --kiln-model-args ARGS.json [--kiln-first-batch FIRST.npy] \
        [--kiln-metrics METRICS.jsonl] [--kiln-info INFO.json] --job.config_file JOB.toml

(with --nproc-per-node N it runs N ranks: the job's data-parallel shard degree says how they split)

1. registers flavor NAME (TransformerModelArgs from ARGS.json) in torchtitan's llama3 flavor table,
   and the llama3 train spec again through torchtitan's `register_train_spec` with a metrics
   builder whose logger also appends every logged step's metrics to METRICS.jsonl (rank 0; rank r
   to METRICS.rankR.jsonl beside it, for its own memory figures);
2. writes the first batch torchtitan's own tokenizer and text dataloader build from the job for
   each data-parallel rank (FIRST.npy: [2, ranks x batch, seq] inputs and labels, rank 0's rows
   first), so the caller can check both sides read the same tokens, and INFO.json (torchtitan's version, the tokenizer's vocabulary size, the flavor's
   FFN width and parameter count built on the meta device);
3. runs `torchtitan.train` as `python -m torchtitan.train` would, with the remaining arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import runpy
import sys


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kiln-flavor", required=True)
    p.add_argument("--kiln-model-args", required=True, help="JSON: TransformerModelArgs fields")
    p.add_argument("--kiln-first-batch")
    p.add_argument("--kiln-metrics")
    p.add_argument("--kiln-info")
    return p.parse_known_args(argv)


class _Recorder:
    """A torchtitan metric logger that appends each step's metrics as a JSON line, then forwards."""

    def __init__(self, inner, path: str):
        self.inner, self.path = inner, path

    def log(self, metrics: dict, step: int) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")
        self.inner.log(metrics, step)

    def close(self) -> None:
        self.inner.close()


def register(flavor: str, fields: dict, metrics_path: str | None):
    """Add the flavor to torchtitan's llama3 table and register the llama3 spec with the recording
    metrics builder; returns the TransformerModelArgs."""
    from torchtitan.components.metrics import build_metrics_processor
    from torchtitan.models import llama3
    from torchtitan.models.llama3.model.args import RoPEScalingArgs, TransformerModelArgs
    from torchtitan.protocols.train_spec import register_train_spec

    fields = dict(fields)
    scaling = RoPEScalingArgs(**fields.pop("rope_scaling_args"))
    args = TransformerModelArgs(**fields, rope_scaling_args=scaling)
    llama3.llama3_args[flavor] = args

    def metrics_builder(job_config, parallel_dims, model_args=None, tag=None):
        processor = build_metrics_processor(job_config, parallel_dims, model_args, tag)
        if metrics_path:
            rank = int(os.environ.get("RANK", "0"))
            stem, ext = os.path.splitext(metrics_path)
            processor.logger = _Recorder(processor.logger, metrics_path if rank == 0 else f"{stem}.rank{rank}{ext}")
        return processor

    spec = dataclasses.replace(llama3.get_train_spec(), model_args=llama3.llama3_args,
                               build_metrics_processor_fn=metrics_builder)
    register_train_spec("llama3", spec)  # user-registered specs take precedence over built-in ones
    return args


def describe(flavor: str, args) -> dict:
    """torchtitan's version and the flavor's model built on the meta device: FFN width, parameters."""
    from importlib.metadata import version

    import torch
    from torchtitan.models.llama3 import Transformer

    with torch.device("meta"):
        model = Transformer(args)
    return {"torchtitan": version("torchtitan"), "flavor": flavor, "model_args": dataclasses.asdict(args),
            "ffn_hidden": int(model.layers["0"].feed_forward.w1.weight.shape[0]),
            "params": sum(p.numel() for p in model.parameters())}


def first_batch(torchtitan_args: list[str], path: str) -> dict:
    """The first batch of torchtitan's own tokenizer + text dataloader for this job."""
    import numpy as np
    from torchtitan.components.tokenizer import build_hf_tokenizer
    from torchtitan.config import ConfigManager
    from torchtitan.hf_datasets.text_datasets import build_text_dataloader

    job = ConfigManager().parse_args(torchtitan_args)
    tokenizer = build_hf_tokenizer(job)
    ranks = max(1, int(job.parallelism.data_parallel_shard_degree))
    parts = []
    for rank in range(ranks):
        loader = build_text_dataloader(dp_world_size=ranks, dp_rank=rank, tokenizer=tokenizer, job_config=job,
                                       infinite=False)
        inputs, labels = next(iter(loader))
        parts.append(np.stack([inputs["input"].numpy(), labels.numpy()]))
    np.save(path, np.concatenate(parts, axis=1))
    return {"tokenizer_vocab_size": tokenizer.get_vocab_size(), "bos_id": tokenizer.bos_id,
            "eos_id": tokenizer.eos_id}


def main(argv: list[str]) -> None:
    ours, rest = _parse(argv)
    # Before torchtitan is imported: its ConfigManager.parse_args defaults to sys.argv[1:] as it was
    # when torchtitan.config.manager was first imported.
    sys.argv = ["torchtitan.train", *rest]
    with open(ours.kiln_model_args, encoding="utf-8") as f:
        fields = json.load(f)
    args = register(ours.kiln_flavor, fields, ours.kiln_metrics)
    if int(os.environ.get("RANK", "0")) == 0:
        info = describe(ours.kiln_flavor, args)
        if ours.kiln_first_batch:
            info.update(first_batch(rest, ours.kiln_first_batch))
        if ours.kiln_info:
            with open(ours.kiln_info, "w", encoding="utf-8") as f:
                json.dump(info, f, indent=1, default=str)
        print(f"torchtitan_llama: {json.dumps(info, default=str)}", flush=True)
    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    # Started by its path, Python puts this folder first on sys.path: take it off, so that kiln's
    # modules beside this script (job.py, peer.py) never shadow a module torchtitan imports.
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    main(sys.argv[1:])
