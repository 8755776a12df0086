"""`kiln bench train-llm --nproc-per-node N`: the corpus in N shards read the way each row's tool
reads it, the figures per GPU, the launched rows' configs and torchtitan's job at N ranks."""

from __future__ import annotations

import ast
import inspect
import json

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from kiln.bench.peers.plain import plain_fsdp
from kiln.bench.peers.torchtitan import job_file as titan
from kiln.bench.train_llm import llm_train_bench as tb
from kiln.bench.train_llm import llm_train_data as data
from kiln.bench.train_llm import llm_train_ranks as ranks
from kiln.config import load_config

VOCAB = data.Vocab(512, 1, 2)


def _contiguous_shard(n_items: int, shards: int, index: int) -> range:
    """`datasets.Dataset.shard(num_shards, index, contiguous=True)`, what `split_dataset_by_node`
    gives rank `index` of a map-style dataset (torchtitan's local text dataset): the first n % N
    shards hold one item more."""
    div, mod = divmod(n_items, shards)
    start = div * index + min(index, mod)
    return range(start, start + div + (index < mod))


def test_one_shard_is_the_single_gpu_corpus(tmp_path):
    one = data.build_corpus(tmp_path / "a", VOCAB, min_tokens=3000, seed=3)
    assert one.shard_tokens == ()
    stream = data.load_stream(one.tokens_path)
    got = data.batches(stream, steps=2, batch=2, seq_len=8)
    seqs = torch.from_numpy(stream[:2 * 2 * 9].astype(np.int64)).view(2, 2, 9)
    assert all(torch.equal(x, s[:, :-1]) and torch.equal(y, s[:, 1:]) for (x, y), s in zip(got, seqs, strict=True))


def test_shards_hold_equal_documents_and_rank_r_reads_its_contiguous_share(tmp_path):
    corpus = data.build_corpus(tmp_path, VOCAB, min_tokens=3000, seed=3, shards=3)
    docs = [json.loads(line)["text"].split() for line in (tmp_path / "text" / "data.jsonl").read_text().splitlines()]
    assert len(docs) % 3 == 0 and corpus.documents == len(docs)
    stream = data.load_stream(corpus.tokens_path)
    assert sum(corpus.shard_tokens) == stream.size and min(corpus.shard_tokens) >= 3000
    offset = 0
    for rank, size in enumerate(corpus.shard_tokens):
        mine = [docs[i] for i in _contiguous_shard(len(docs), 3, rank)]
        # BOS + words + EOS per document, as torchtitan's dataset encodes each one.
        expect = np.concatenate([[VOCAB.bos_id, *(int(w[1:]) for w in d), VOCAB.eos_id] for d in mine])
        assert np.array_equal(stream[offset:offset + size], expect)
        offset += size
    # The global batch: rank 0's local batch, then rank 1's, then rank 2's, each cut from its shard.
    got = data.batches(stream, steps=2, batch=2, seq_len=8, shard_tokens=corpus.shard_tokens)
    assert got[1][0].shape == (6, 8)
    second = stream[corpus.shard_tokens[0]:][2 * 9:3 * 9]  # rank 1, batch 1, first sequence
    assert got[1][0][2].tolist() == second[:8].tolist() and got[1][1][2].tolist() == second[1:].tolist()


def test_rank_files_give_each_rank_its_rows_through_an_unshuffled_sampler(tmp_path):
    nproc, local, steps = 2, 3, 4
    batches = [(torch.arange(k * 600, k * 600 + 6 * 5).view(6, 5), -torch.arange(k * 600, k * 600 + 30).view(6, 5))
               for k in range(steps)]
    inputs, labels = (np.load(p) for p in data.write_rank_files(batches, nproc, tmp_path))
    assert inputs.shape == (steps * nproc * local, 5)
    for rank in range(nproc):
        order = list(DistributedSampler(range(len(inputs)), num_replicas=nproc, rank=rank, shuffle=False,
                                        drop_last=True))
        for k in range(steps):
            idx = order[k * local:(k + 1) * local]
            rows = slice(rank * local, (rank + 1) * local)
            assert np.array_equal(inputs[idx], batches[k][0][rows].numpy())
            assert np.array_equal(labels[idx], batches[k][1][rows].numpy())


def test_figures_at_n_gpus_count_the_global_batch_against_n_peaks():
    row = tb.figures([0.1, 0.1, 0.1], warmup=1, tokens_per_step=4000, fpt=10, spec=1e6, matmul=5e5, gpus=4)
    assert row["tokens_per_s"] == pytest.approx(40_000) and row["tokens_per_s_per_gpu"] == pytest.approx(10_000)
    assert row["tflops"] == pytest.approx(4e5 / 4 / 1e12)
    assert row["mfu_spec"] == pytest.approx(0.1) and row["mfu_matmul"] == pytest.approx(0.2)


def test_launched_overrides_read_the_rank_files_and_log_every_step(tmp_path):
    opts = tb.TrainLlmOptions(model="m", hf={}, seq_len=64, batch=2, steps=40, warmup=1, rows=[])
    base = tb.base_overrides(opts, "llama:llama-tiny", tmp_path / "t.bin", "cuda:0")
    files = (tmp_path / "inputs.npy", tmp_path / "labels.npy")
    cfg = load_config(None, [*ranks.launched_overrides(base, files, "cuda"), "distributed.strategy=fsdp"])
    assert cfg.data.source == "files" and cfg.data.path == str(files[0]) and cfg.data.labels_path == str(files[1])
    assert cfg.data.shuffle is False and cfg.training.device == "cuda" and cfg.training.log_interval == 1
    assert cfg.checkpoint.save_final is False and cfg.checkpoint.interval == 0
    assert cfg.optim.warmup_steps == opts.hyper.warmup_steps and cfg.data.batch_size == 2


def test_plan_peak_reads_the_plans_total():
    assert ranks.plan_peak({"total_bytes": 7, "parts": {"params": 3}}) == 7
    assert ranks.plan_peak({"total_bytes": 5.0}) == 5
    assert ranks.plan_peak({"rows": []}) is None and ranks.plan_peak(None) is None


def test_torchtitan_at_two_ranks_shards_fsdp_over_both_with_selective_ac(tmp_path):
    from kiln.config.load import tomllib

    job = titan.PeerJob(workdir=tmp_path / "w", tokenizer_dir=tmp_path / "tok", dataset_dir=tmp_path / "text",
                        weights_dir=tmp_path / "init", batch=1, seq_len=8192, steps=30, seed=0, lr=1e-4,
                        betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, warmup_steps=15, max_norm=1.0, nproc=2,
                        activation_checkpoint="selective")
    tables = tomllib.loads(titan.write_job(tmp_path / "job.toml", titan.job_config(job)).read_text())
    assert tables["parallelism"] == {"data_parallel_shard_degree": 2}
    assert tables["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert tables["training"]["local_batch_size"] == 1 and tables["compile"]["components"] == ["model", "loss"]
    assert tables["training"]["mixed_precision_param"] == "bfloat16"
    cmd = titan.command(tmp_path / "job.toml", tmp_path / "a.json", tmp_path / "w", 2)
    assert cmd[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    assert cmd[6] == str(titan.launcher_path()) and cmd[-2:] == ["--job.config_file", str(tmp_path / "job.toml")]
    assert titan.rank_metrics_path(tmp_path / "metrics.jsonl", 0) == tmp_path / "metrics.jsonl"
    assert titan.rank_metrics_path(tmp_path / "metrics.jsonl", 3) == tmp_path / "metrics.rank3.jsonl"


def test_plain_fsdp_loop_imports_no_kiln_code():
    tree = ast.parse(inspect.getsource(plain_fsdp))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert "torch.distributed.fsdp" in names and not [n for n in names if n.split(".")[0] == "kiln"]


def _run(tmp_path, steps=3):
    from kiln.bench.train_llm.llm_train_bench import RowSpec
    from kiln.bench.train_llm.llm_train_result import RowRun, TrainContext

    opts = tb.TrainLlmOptions(model="m", hf={}, seq_len=8, batch=1, steps=steps, warmup=1, rows=[], nproc=2)
    ctx = TrainContext(device=torch.device("cuda", 0), data_dir=tmp_path, corpus=None, vocab=VOCAB, weights_dir=tmp_path,
                       tokens_per_step=16, flops_per_token=10, spec=1e6, spec_source="t", matmul=5e5, base_overrides=[],
                       nproc=2)
    return RowRun(RowSpec("k", "kiln"), opts, ctx, [], None)


def test_a_launched_run_is_read_back_from_its_metrics_and_summary(tmp_path):
    from kiln.bench.train_llm.llm_train_result import TrainRow

    records = [{"step": i, "loss": 5.0 - i, "step_ms": ms, "peak_mem_bytes_max_rank": peak}
               for i, ms, peak in ((1, 9000.0, 10), (2, 100.0, 30), (3, 100.0, 20))]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "strategy": "fsdp", "num_params": 7,
                                                       "memory_plan": {"total_bytes": 25}}))
    row = ranks.read_run(TrainRow("k", "kiln"), _run(tmp_path), tmp_path, 0, 60.0)
    assert row.status == "ok" and row.losses == [4.0, 3.0, 2.0] and row.first_step_s == 9.0
    assert row.step_ms == pytest.approx(100.0) and row.tokens_per_s == pytest.approx(160.0)
    assert row.peak_mem_bytes == 30 and row.plan_bytes == 25 and row.applied_strategy == "fsdp" and row.params == 7
    (tmp_path / "summary.json").write_text(json.dumps({"status": "failed"}))
    (tmp_path / "launch.log").write_text("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate\n")
    oom = ranks.read_run(TrainRow("k", "kiln"), _run(tmp_path), tmp_path, 1, 60.0)
    assert oom.status == "oom" and "out of memory" in oom.reason
    late = ranks.read_run(TrainRow("k", "kiln"), _run(tmp_path), tmp_path, 124, 60.0)
    assert late.status == "error" and late.reason.startswith("stopped after 60 s")
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed"}))
    short = ranks.read_run(TrainRow("k", "kiln"), _run(tmp_path, steps=5), tmp_path, 0, 60.0)
    assert short.status == "error" and short.reason == "logged 3 of 5 steps"
