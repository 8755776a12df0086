from __future__ import annotations

import json
import logging
import math
import textwrap

import pytest

from kiln.config import load_config
from kiln.errors import ConfigError
from kiln.train.trainer import Trainer, train

METRIC_KEYS = {"step", "loss", "lr", "grad_norm", "samples_per_s", "step_ms", "data_wait_frac"}
SUMMARY_KEYS = {"status", "steps", "final_loss", "samples_per_s", "step_ms_median", "peak_mem_bytes"}


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_writes_contract_files(tmp_path, tiny_overrides):
    run_dir = tmp_path / "run"
    summary = train(load_config(None, tiny_overrides), run_dir)
    assert SUMMARY_KEYS <= summary.keys()
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["status"] == "completed" and on_disk["steps"] == 30
    assert load_config(run_dir / "config.toml").training.steps == 30
    records = _records(run_dir)
    assert [r["step"] for r in records] == [1, 5, 10, 15, 20, 25, 30]
    for r in records:
        assert METRIC_KEYS <= r.keys()
        assert 0.0 <= r["data_wait_frac"] <= 1.0
    assert records[0]["first_step"] is True
    assert summary["final_loss"] < summary["first_loss"]
    assert summary["flops_per_step"] > 0
    assert summary["peak_mem_bytes"] > 0


def test_lr_schedule_is_logged(tmp_path, tiny_overrides):
    run_dir = tmp_path / "run"
    train(load_config(None, [*tiny_overrides, "optim.warmup_steps=10", "optim.lr=0.01"]), run_dir)
    lrs = {r["step"]: r["lr"] for r in _records(run_dir)}
    # Each record holds the LR its step used (step s uses the schedule's factor at s - 1), not the
    # next step's: 5/10 of the peak at step 5 of a 10-step warm-up, the peak at step 10.
    assert lrs[5] == pytest.approx(0.01 * 5 / 10)
    assert lrs[10] == pytest.approx(0.01, rel=1e-6)
    # The last step's cosine: progress 19/20 (min_lr_ratio 0.1), not yet the floor.
    assert lrs[30] == pytest.approx(0.01 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 19 / 20))), rel=1e-6)


def test_grad_accumulation_matches_larger_batch(tmp_path, tiny_overrides):
    base = [*tiny_overrides, "training.deterministic=true", "training.steps=10"]
    big = train(load_config(None, [*base, "data.batch_size=16"]), tmp_path / "big")
    acc = train(load_config(None, [*base, "data.batch_size=8", "training.grad_accum_steps=2"]), tmp_path / "acc")
    assert acc["global_batch"] == big["global_batch"] == 16
    assert acc["final_loss"] == pytest.approx(big["final_loss"], rel=1e-4)


def test_deterministic_runs_repeat_exactly(tmp_path, tiny_overrides):
    over = [*tiny_overrides, "training.deterministic=true", "model.kwargs.dropout=0.1"]
    a = train(load_config(None, over), tmp_path / "a")
    b = train(load_config(None, over), tmp_path / "b")
    assert [r["loss"] for r in _records(tmp_path / "a")] == [r["loss"] for r in _records(tmp_path / "b")]
    assert a["final_loss"] == b["final_loss"]


def test_eval_loop_reports_loss_and_accuracy(tmp_path, tiny_overrides):
    run_dir = tmp_path / "run"
    summary = train(load_config(None, [*tiny_overrides, "training.eval_interval=10", "training.eval_steps=3"]), run_dir)
    assert 0.0 <= summary["eval_accuracy"] <= 1.0
    assert summary["eval_loss"] > 0
    assert [r["step"] for r in _records(run_dir) if "eval_loss" in r] == [10, 20, 30]


def test_causal_lm_reports_tokens(tmp_path):
    over = [
        "model.name=hf:llama-tiny", "data.batch_size=4", "data.seq_len=32", "data.synthetic_samples=64",
        "training.steps=12", "training.log_interval=4", "training.device=cpu", "optim.lr=3e-3",
        "metrics.console=false", "metrics.tensorboard=false",
    ]
    summary = train(load_config(None, over), tmp_path / "run")
    assert summary["task"] == "causal_lm"
    assert summary["tokens_per_s"] == pytest.approx(summary["samples_per_s"] * 32, rel=1e-6)
    assert summary["final_loss"] < summary["first_loss"]


def test_user_model_from_file(tmp_path, tiny_overrides, monkeypatch):
    src = tmp_path / "mymodel.py"
    src.write_text(textwrap.dedent("""
        import torch
        def make(width=16):
            net = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 3))
            return net, {"kind": "features", "shape": (8,), "num_classes": 3}
    """))
    monkeypatch.chdir(tmp_path)
    over = [o for o in tiny_overrides if not o.startswith("model.kwargs")]
    summary = train(load_config(None, [*over, "model.name=mymodel.py:make", "model.kwargs.width=12"]), tmp_path / "run")
    assert summary["status"] == "completed"
    assert summary["num_params"] == 8 * 12 + 12 + 12 * 3 + 3


def test_existing_run_dir_is_not_overwritten(tmp_path, tiny_overrides):
    run_dir = tmp_path / "run"
    train(load_config(None, tiny_overrides), run_dir)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    # The same config again: the run is complete, nothing to do, nothing written.
    summary = train(load_config(None, tiny_overrides), run_dir)
    assert summary["already_complete"] is True and summary["steps"] == 30
    # resume=never refuses it, naming the way on.
    with pytest.raises(ConfigError, match="checkpoint.resume=auto"):
        Trainer(load_config(None, [*tiny_overrides, "checkpoint.resume=never"]), run_dir)
    after = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert after == before


def test_bad_model_name_fails_before_run_dir_exists(tmp_path, tiny_overrides):
    with pytest.raises(ConfigError, match="model.name"):
        Trainer(load_config(None, [*tiny_overrides, "model.name=no_such_model"]), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_language_model_validates_on_a_prepared_directory(tmp_path):
    from kiln.data.prepare import PrepareOptions, prepare
    from kiln.report.contents import make_report

    lines = [f"The {w} sat on the {v} by the door." for w in ("cat", "dog", "owl", "fox") for v in ("mat", "rug")]
    (tmp_path / "t.txt").write_text("\n".join(lines * 60) + "\n")
    prepare(PrepareOptions(inputs=[str(tmp_path / "t.txt")], out=tmp_path / "data", train_bpe=300, val_fraction=0.1))
    over = [
        "model.name=hf:llama-tiny", "data.source=tokens", f"data.path={tmp_path / 'data'}", "data.seq_len=32",
        "data.batch_size=4", "data.num_workers=0", "training.steps=8", "training.log_interval=2",
        "training.eval_interval=4", "training.eval_steps=2", "training.device=cpu", "optim.lr=3e-3",
        "metrics.console=false", "metrics.tensorboard=false",
    ]
    summary = train(load_config(None, over), tmp_path / "run")
    evals = [r for r in _records(tmp_path / "run") if "eval_loss" in r]
    assert [r["step"] for r in evals] == [4, 8]
    for r in evals:
        assert r["eval_perplexity"] == pytest.approx(math.exp(r["eval_loss"]), rel=1e-12)
    assert summary["eval_perplexity"] == evals[-1]["eval_perplexity"]
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]
    report = make_report(tmp_path / "run")["md"].read_text()
    assert "## Validation" in report and f"{evals[-1]['eval_perplexity']:,.2f}" in report


def test_summary_has_the_total_of_an_async_save_completed_after_the_last_step(tmp_path, tiny_overrides, monkeypatch,
                                                                             caplog):
    """The step-27 save is still being written when the loop ends (its writes take a second more
    here); closing the checkpointer completes it, and summary.json then has its total time, not None."""
    import time

    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    write_data = FileSystemWriter.write_data

    def slow_write_data(self, *args, **kwargs):
        time.sleep(1.0)
        return write_data(self, *args, **kwargs)

    monkeypatch.setattr(FileSystemWriter, "write_data", slow_write_data)
    monkeypatch.setattr("kiln.checkpoint.save_timing.PROGRESS_EVERY_S", 0.2)
    caplog.set_level(logging.INFO, logger="kiln.checkpoint")
    run_dir = tmp_path / "run"
    over = [*tiny_overrides, "checkpoint.interval=27", "checkpoint.async_save=true", "checkpoint.save_final=false"]
    summary = train(load_config(None, over), run_dir)
    # the wait for it after the last step says so (rank 0, every PROGRESS_EVERY_S)
    assert any("checkpoint step 27: still saving" in r.getMessage() for r in caplog.records)
    saves = json.loads((run_dir / "summary.json").read_text())["checkpoint_saves"]
    assert summary["checkpoint_saves"] == saves
    assert [(s["step"], s["async"]) for s in saves["saves"]] == [(27, True)]
    assert saves["saves"][0]["total_s"] > 0 and saves["total_s_max"] == saves["saves"][0]["total_s"]
    assert saves["prepare_s"] is None  # CPU: no page-locked staging to prepare
