"""The GPU memory plan's arithmetic (kiln.train.gpu_memory), each part against hand-computed bytes, and
the refusal of a run that cannot fit (kiln.train.gpu_plan): exit 2 before the model is built, naming
the settings that would fit, cheapest first; the plan and the measured peak in summary.json."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from kiln.config import load_config
from kiln.errors import ConfigError
from kiln.train import build_run, gpu_plan
from kiln.train.gpu_memory import (
    COMPILE_WORKSPACE_BYTES,
    GIB,
    WORKSPACE_BYTES,
    ModelShape,
    Setup,
    fits,
    logits_bytes,
    plan_gpu,
)
from kiln.train.gpu_plan import Measured, check_fits, plan_of
from kiln.train.memory_plan import Activations

SHAPE = ModelShape(params=1000, units=(300, 300, 200), matmul_params=600, vocab=50)  # root: 200
FSDP = Setup(strategy="fsdp", world_size=4, param_bytes=4, autocast_bytes=2, gather_bytes=2, reduce_bytes=4)


def test_fsdp_parts_per_rank():
    plan = plan_gpu(SHAPE, FSDP, activations=5000, logits=700)
    assert plan.parts == {
        "parameters": 250 * 4,  # ceil(1000 / 4) elements in fp32
        "gradients": 250 * 4,
        "optimizer state": 250 * 2 * 4,  # AdamW's two moments in the storage dtype
        "all-gather buffers": (200 + 200 + 2 * 300) * 2,  # root + last unit + (prefetch 1 + 1) x largest, bf16
        "reduce-scatter buffers": 300 * (2 * 2 + 4),  # largest unit's bf16 gradients twice + its fp32 RS input
        "activations": 5000,
        "logits + loss": 700,
        "workspace (allowance)": WORKSPACE_BYTES,
    }
    assert plan.total == 1000 + 1000 + 2000 + 2000 + 2400 + 5000 + 700 + WORKSPACE_BYTES


def test_sharding_rounds_up_and_master_weights_keep_fp32_state():
    setup = dataclasses.replace(FSDP, world_size=3, param_bytes=2, master_weights=True, compiled=True)
    parts = plan_gpu(SHAPE, setup, activations=0, logits=0).parts
    assert parts["parameters"] == parts["gradients"] == 334 * 2  # ceil(1000 / 3) in bf16
    assert parts["optimizer state"] == 334 * (2 * 4 + 4)  # fp32 moments and the fp32 master copy
    assert parts["workspace (allowance)"] == WORKSPACE_BYTES + COMPILE_WORKSPACE_BYTES


def test_without_resharding_every_unit_stays_gathered():
    parts = plan_gpu(SHAPE, dataclasses.replace(FSDP, reshard_after_forward=False), activations=0, logits=0).parts
    assert parts["all-gather buffers"] == 1000 * 2
    deeper = plan_gpu(SHAPE, dataclasses.replace(FSDP, prefetch=2), activations=0, logits=0).parts
    assert deeper["all-gather buffers"] == (200 + 200 + 3 * 300) * 2


def test_one_process_and_ddp():
    none = plan_gpu(SHAPE, dataclasses.replace(FSDP, strategy="none", world_size=1), activations=0, logits=0).parts
    assert none["parameters"] == 4000 and none["optimizer state"] == 8000
    assert none["autocast weight copies"] == 600 * 2  # autocast's cached bf16 copy of each matmul weight
    assert "all-gather buffers" not in none
    ddp = plan_gpu(SHAPE, dataclasses.replace(FSDP, strategy="ddp", autocast_bytes=None, ddp_bucket_views=False),
                   activations=0, logits=0).parts
    assert ddp["DDP gradient buckets"] == 4000 and "autocast weight copies" not in ddp


def test_logits_and_headroom():
    assert logits_bytes(10, 50, "plain", 2, 400) == 10 * 50 * (2 + 4 + 4)
    assert logits_bytes(10, 50, "chunked", 2, 400) == 2 * 400  # one 400-byte chunk of fp32 logits + its gradient
    assert logits_bytes(1, 50, "chunked", 2, 400) == 2 * 200  # less than a chunk
    assert fits(90, 100, 100) and not fits(91, 100, 100)  # 10 % of the device kept free


# A model of 5 x 2^27 parameters (4 units of 2^27 and a root of 2^27) at 2 FSDP ranks: 7 GiB of
# state per rank (parameters 1.25, gradients 1.25, AdamW 2.5, all-gather 1, reduce-scatter 1) + 1 GiB
# of workspace; a micro-batch of 4 x 1024 tokens saves 16 GiB (none), 13 GiB (selective: inputs 1 +
# one block 4 + kept outputs 8) or 5 GiB (full), and its chunked loss 2 GiB.
UNIT = 2**27
BIG = ModelShape(params=5 * UNIT, units=(UNIT,) * 4, matmul_params=4 * UNIT, vocab=2**16)
ACTS = Activations(outside=0, per_block=[4 * GIB] * 4, block_inputs=GIB, largest=0, selective=[2 * GIB] * 4)
MEASURED = Measured(shape=BIG, acts=ACTS, batch=4, seq=1024, task="causal_lm", ce_kernel="chunked", compute_bytes=2)
SETUP = Setup(strategy="fsdp", world_size=2, param_bytes=4, autocast_bytes=2)


def _cfg(*extra):
    return load_config(None, ["model.name=llama:llama-tiny", "data.batch_size=4", "data.seq_len=1024", *extra])


def test_the_plan_scales_with_checkpointing_batch_and_length():
    assert plan_of(MEASURED, SETUP, checkpointing="none", batch=4, seq=1024).total == 26 * GIB
    assert plan_of(MEASURED, SETUP, checkpointing="selective", batch=4, seq=1024).total == 23 * GIB
    assert plan_of(MEASURED, SETUP, checkpointing="full", batch=4, seq=1024).total == 15 * GIB
    assert plan_of(MEASURED, SETUP, checkpointing="none", batch=2, seq=1024).total == 17 * GIB


def test_a_run_that_cannot_fit_names_what_would_cheapest_first():
    plan = plan_of(MEASURED, SETUP, checkpointing="none", batch=4, seq=1024)
    with pytest.raises(ConfigError) as err:
        check_fits(plan, MEASURED, _cfg(), free=20 * GIB, capacity=20 * GIB, where="cuda:0 (H100)")
    # 18 GiB usable: full checkpointing 15; batch 2 17 (batch 3: 21.5); length 568 (8 + 18 x 568 / 1024)
    assert err.value.key == "training.activation_checkpointing"
    assert ("this run needs about 26.0 GiB per rank (fsdp, 2 ranks: parameters 1.2 GiB, gradients 1.2 GiB, "
            "optimizer state 2.5 GiB, all-gather buffers 1.0 GiB, reduce-scatter buffers 1.0 GiB, activations "
            "16.0 GiB, logits + loss 2.0 GiB, workspace (allowance) 1.0 GiB); cuda:0 (H100) has 20.0 GiB free of "
            "20.0 GiB, 10% of it kept as headroom: it fits with any one of: training.activation_checkpointing=full; "
            "data.batch_size=2; data.seq_len=568 (KILN_SKIP_MEMORY_CHECK=1 tries anyway)") in str(err.value)
    check_fits(plan, MEASURED, _cfg(), free=30 * GIB, capacity=30 * GIB, where="x")  # 26 <= 27: fits


def test_sharding_or_more_ranks_are_named_when_the_state_is_what_does_not_fit():
    one = dataclasses.replace(MEASURED, batch=1)  # full checkpointing at batch 1: 5 GiB + 0.5 GiB of loss
    cfg = _cfg("data.batch_size=1", "training.activation_checkpointing=full")
    ddp = dataclasses.replace(SETUP, strategy="ddp", autocast_bytes=None)  # 5 x 2^27 x (4 + 4 + 8) = 10 GiB of state
    plan = plan_of(one, ddp, checkpointing="full", batch=1, seq=1024)
    assert plan.total == 33 * GIB // 2  # 10 + 5 + 0.5 + 1
    with pytest.raises(ConfigError) as err:  # 13.5 usable: FSDP2 at 2 ranks needs 7 + 5 + 0.5 + 1 = 13.5,
        check_fits(plan, one, cfg, free=15 * GIB, capacity=15 * GIB, where="x")  # DDP 11 + 5.5 x seq / 1024
    assert err.value.key == "data.seq_len" and str(err.value).endswith(
        "it fits with any one of: data.seq_len=465; distributed.strategy=fsdp (KILN_SKIP_MEMORY_CHECK=1 tries anyway)")
    sharded = plan_of(one, SETUP, checkpointing="full", batch=1, seq=1024)
    with pytest.raises(ConfigError) as err:  # 10.8 usable: 8 + 5.5 x seq / 1024; 4 ranks 4.5 + 6.5, 5 ranks 4 + 6.5
        check_fits(sharded, one, cfg, free=12 * GIB, capacity=12 * GIB, where="x")
    assert err.value.key == "data.seq_len" and str(err.value).endswith(
        "it fits with any one of: data.seq_len=521; 5 ranks (--nproc-per-node, or more nodes) "
        "(KILN_SKIP_MEMORY_CHECK=1 tries anyway)")
    with pytest.raises(ConfigError, match="no single setting makes it fit"):
        check_fits(sharded, one, cfg, free=GIB, capacity=GIB, where="x")


def test_a_refused_run_exits_2_before_the_model_is_built(tmp_path, monkeypatch, capsys):
    from kiln.cli.main import main

    monkeypatch.setattr(build_run, "device_memory", lambda device: (GIB, GIB))  # a 1 GiB device: nothing fits

    def no_build(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(build_run, "build_model", no_build)
    run_dir = tmp_path / "run"
    code = main(["train", "--run-dir", str(run_dir), "model.name=llama:llama-tiny", "training.device=cpu",
                 "data.seq_len=32", "training.steps=1"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2, err
    assert err.startswith("kiln: error: model.name: this run needs about 1.0 GiB per rank (none, 1 rank: ")
    assert "no single setting makes it fit" in err and not run_dir.exists()


def test_summary_keeps_the_plan_and_the_measured_peak(tmp_path):
    from kiln.train.trainer import train

    train(load_config(None, ["model.name=llama:llama-tiny", "training.device=cpu", "data.seq_len=32",
                             "data.batch_size=2", "training.steps=1", "metrics.console=false",
                             "metrics.tensorboard=false"]), tmp_path / "run")
    record = json.loads((tmp_path / "run" / "summary.json").read_text())["memory_plan"]
    assert set(record) == {"parts", "total_bytes", "strategy", "world_size", "setup", "notes", "measured"}
    assert record["strategy"] == "none" and record["world_size"] == 1 and record["measured"] is None  # CPU
    assert record["total_bytes"] == sum(record["parts"].values())
    num_params = json.loads((tmp_path / "run" / "summary.json").read_text())["num_params"]
    assert record["parts"]["parameters"] == num_params * 4 and record["parts"]["optimizer state"] == num_params * 8


def test_the_launcher_refuses_with_nvmls_figures(tmp_path, monkeypatch):
    from kiln.precision import resolve_precision
    from kiln.train import preflight
    from kiln.train.memory_plan import meta_model
    from kiln.train.plan import Placement

    monkeypatch.setattr(preflight, "launcher_device_memory", lambda ranks: (GIB, GIB))
    cfg = load_config(None, ["model.name=llama:llama-tiny", "distributed.strategy=fsdp", "data.seq_len=32"])
    policy = resolve_precision(cfg.precision.policy, torch.device("meta"))
    with pytest.raises(ConfigError, match=r"\(fsdp, 2 ranks: .*each GPU \(NVML, before starting ranks\)"):
        preflight._plan_on_gpus(cfg, meta_model(cfg), policy, Placement("cuda", 2, launched=True))
    monkeypatch.setattr(preflight, "launcher_device_memory", lambda ranks: None)  # no NVML: the ranks check
    preflight._plan_on_gpus(cfg, meta_model(cfg), policy, Placement("cuda", 2, launched=True))
    assert gpu_plan.MAX_RANKS >= 8
