"""The GPU memory plan's arithmetic (kiln.train.gpu_memory), each part against hand-computed bytes, and
the refusal of a run that cannot fit (kiln.train.gpu_plan): exit 2 before the model is built, naming
the settings that would fit, cheapest first; the plan and the measured peak in summary.json."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from kiln.config import load_config
from kiln.errors import ConfigError
from kiln.precision import resolve_precision
from kiln.train import build_run, gpu_plan
from kiln.train.activation_bytes import DecoderDims, Micro, Widths, activations_saved, loss_saved, recompute_bytes
from kiln.train.gpu_memory import (
    COMPILE_WORKSPACE_BYTES,
    GIB,
    HEADROOM,
    WORKSPACE_BYTES,
    ModelShape,
    Setup,
    StepMemory,
    fits,
    logits_bytes,
    plan_gpu,
)
from kiln.train.gpu_plan import Measured, check_fits, plan_of
from kiln.train.memory_plan import Activations, meta_model

SHAPE = ModelShape(params=1000, units=(300, 300, 200), matmul_params=600, vocab=50)  # root: 200
FSDP = Setup(strategy="fsdp", world_size=4, param_bytes=4, autocast_bytes=2, gather_bytes=2, reduce_bytes=4)


def test_fsdp_parts_and_the_three_moments():
    step = StepMemory(activations=5000, loss=300, loss_transient=700, backward_transient=400)
    plan = plan_gpu(SHAPE, FSDP, step)
    assert plan.parts == {
        "parameters": 250 * 4,  # ceil(1000 / 4) elements in fp32
        "gradients": 250 * 4,
        "optimizer state": 250 * 2 * 4,  # AdamW's two moments in the storage dtype
        "all-gather buffers": (200 + 200 + 300) * 2,  # root + last unit + prefetch 1 x largest, bf16
        "reduce-scatter buffers": 300 * (2 * 2 + 4),  # largest unit's bf16 gradients twice + its fp32 RS input
        "activations": 5000,
        "logits + loss": 300,
        "loss transient": 700,
        "backward transient": 400,
        "workspace (allowance)": WORKSPACE_BYTES,
    }
    held = 1000 + 2000  # parameters and optimizer state: no gradients between steps
    assert plan.phases == {"forward end": held + 1400 + 5000 + 300 + 700 + WORKSPACE_BYTES,
                           "backward start": held + 1400 + 2400 + 5000 + 300 + 400 + WORKSPACE_BYTES,
                           "optimizer step": 4000 + WORKSPACE_BYTES}
    assert plan.total == 12500 + WORKSPACE_BYTES  # backward start
    assert plan.slack == (12500 + WORKSPACE_BYTES - held) // 2 and plan.reserved == plan.total + plan.slack
    accumulating = plan_gpu(SHAPE, FSDP, dataclasses.replace(step, accumulating=True))
    assert accumulating.total == plan.total + 1000  # gradients held through the micro-batches
    assert accumulating.slack == plan.slack


def test_sharding_rounds_up_and_master_weights_keep_fp32_state():
    setup = dataclasses.replace(FSDP, world_size=3, param_bytes=2, master_weights=True, compiled=True)
    parts = plan_gpu(SHAPE, setup, StepMemory(0)).parts
    assert parts["parameters"] == parts["gradients"] == 334 * 2  # ceil(1000 / 3) in bf16
    assert parts["optimizer state"] == 334 * (2 * 4 + 4)  # fp32 moments and the fp32 master copy
    assert parts["workspace (allowance)"] == WORKSPACE_BYTES + COMPILE_WORKSPACE_BYTES


def test_without_resharding_every_unit_stays_gathered():
    parts = plan_gpu(SHAPE, dataclasses.replace(FSDP, reshard_after_forward=False), StepMemory(0)).parts
    assert parts["all-gather buffers"] == 1000 * 2
    deeper = plan_gpu(SHAPE, dataclasses.replace(FSDP, prefetch=2), StepMemory(0)).parts
    assert deeper["all-gather buffers"] == (200 + 200 + 2 * 300) * 2


def test_one_process_and_ddp():
    none = plan_gpu(SHAPE, dataclasses.replace(FSDP, strategy="none", world_size=1), StepMemory(0))
    assert none.parts["parameters"] == 4000 and none.parts["optimizer state"] == 8000
    assert none.parts["autocast weight copies"] == 600 * 2  # autocast's cached bf16 copy of each matmul weight
    assert "all-gather buffers" not in none.parts
    assert none.total == 4000 * 4 + 1200 + WORKSPACE_BYTES and none.slack == WORKSPACE_BYTES // 2  # the step's peak
    ddp = plan_gpu(SHAPE, dataclasses.replace(FSDP, strategy="ddp", autocast_bytes=None, ddp_bucket_views=False),
                   StepMemory(0)).parts
    assert ddp["DDP gradient buckets"] == 4000 and "autocast weight copies" not in ddp


def test_logits_and_headroom():
    assert logits_bytes(10, 50, "plain", 2, 400) == 10 * 50 * (2 + 4 + 4)
    assert logits_bytes(10, 50, "chunked", 2, 400) == 2 * 400  # one 400-byte chunk of fp32 logits + its gradient
    assert logits_bytes(1, 50, "chunked", 2, 400) == 2 * 200  # less than a chunk
    assert fits(97, 100, 100) and not fits(98, 100, 100)  # 3 % of the device kept free


# A model of 5 x 2^27 parameters (4 units of 2^27 and a root of 2^27) at 2 FSDP ranks: per rank,
# parameters 1.25, gradients 1.25, AdamW 2.5, all-gather 0.75 (root, last unit, one prefetched),
# reduce-scatter 1, workspace 1 GiB. A micro-batch of 4 x 1024 tokens (measured: not kiln's decoder)
# saves 16 GiB (none), 13 GiB (selective: inputs 1 + one block 4 + kept outputs 8) or 5 GiB (full);
# its chunked loss makes one 1 GiB chunk of fp32 logits and its gradient (2 GiB, at the forward's end).
UNIT = 2**27
BIG = ModelShape(params=5 * UNIT, units=(UNIT,) * 4, matmul_params=4 * UNIT, vocab=2**16)
ACTS = Activations(outside=0, per_block=[4 * GIB] * 4, block_inputs=GIB, largest=0, selective=[2 * GIB] * 4)
MEASURED = Measured(shape=BIG, acts=ACTS, batch=4, seq=1024, task="causal_lm", ce_kernel="chunked", compute_bytes=2)
SETUP = Setup(strategy="fsdp", world_size=2, param_bytes=4, autocast_bytes=2)


def _cfg(*extra):
    return load_config(None, ["model.name=llama:llama-tiny", "data.batch_size=4", "data.seq_len=1024", *extra])


def test_the_plan_scales_with_checkpointing_batch_and_length():
    # forward end: parameters + optimizer state 3.75, all-gather 0.75, activations, loss 2, workspace 1
    assert plan_of(MEASURED, SETUP, checkpointing="none", batch=4, seq=1024).total == 47 * GIB // 2
    assert plan_of(MEASURED, SETUP, checkpointing="selective", batch=4, seq=1024).total == 41 * GIB // 2
    assert plan_of(MEASURED, SETUP, checkpointing="full", batch=4, seq=1024).total == 25 * GIB // 2
    assert plan_of(MEASURED, SETUP, checkpointing="none", batch=2, seq=1024).total == 29 * GIB // 2  # acts 8, loss 1
    none = plan_of(MEASURED, SETUP, checkpointing="none", batch=4, seq=1024)
    assert none.reserved == 47 * GIB // 2 + (47 * GIB // 2 - 15 * GIB // 4) // 2  # + half of what is not state


def test_a_run_that_cannot_fit_names_what_would_cheapest_first():
    plan = plan_of(MEASURED, SETUP, checkpointing="none", batch=4, seq=1024)
    with pytest.raises(ConfigError) as err:
        check_fits(plan, MEASURED, free=20 * GIB, capacity=20 * GIB, where="cuda:0 (H100)")
    # 19.4 GiB usable for the reserved figure (allocated a + (a - 3.75) / 2): full checkpointing 12.5 -> 16.9;
    # batch 2: 14.5 -> 19.9, batch 1: 10 -> 13.1; length s (below 512 backward's start is the peak, the
    # reduce-scatter buffers over the loss's chunk): a = 6.5 + 16 s / 1024, 7.875 + 24 s / 1024 <= 19.4 at s <= 491
    assert err.value.key == "training.activation_checkpointing"
    assert ("this run needs about 33.4 GiB per rank (fsdp, 2 ranks: parameters 1.2 GiB, gradients 1.2 GiB, "
            "optimizer state 2.5 GiB, all-gather buffers 0.8 GiB, reduce-scatter buffers 1.0 GiB, activations "
            "16.0 GiB, loss transient 2.0 GiB, workspace (allowance) 1.0 GiB; allocated peak 23.5 GiB + allocator "
            "slack 9.9 GiB); cuda:0 (H100) has 20.0 GiB free of 20.0 GiB, 3% of it kept as headroom: it fits with "
            "any one of: training.activation_checkpointing=full; data.batch_size=1; data.seq_len=491 "
            "(KILN_SKIP_MEMORY_CHECK=1 tries anyway)") in str(err.value)
    check_fits(plan, MEASURED, free=35 * GIB, capacity=35 * GIB, where="x")  # 33.4 <= 33.95: fits


def test_sharding_or_more_ranks_are_named_when_the_state_is_what_does_not_fit():
    one = dataclasses.replace(MEASURED, batch=1)  # measured at batch 1: full checkpointing 5 GiB, loss 0.5 GiB
    ddp = dataclasses.replace(SETUP, strategy="ddp", autocast_bytes=None)  # 5 x 2^27 x (4 + 4 + 8) = 10 GiB of state
    plan = plan_of(one, ddp, checkpointing="full", batch=1, seq=1024)
    assert plan.total == 14 * GIB and plan.reserved == 69 * GIB // 4  # 7.5 + 5 + 0.5 + 1, + (14 - 7.5) / 2
    with pytest.raises(ConfigError) as err:  # 14.55 usable: DDP at length s: 9 + 8.25 s / 1024 (s <= 688);
        check_fits(plan, one, free=15 * GIB, capacity=15 * GIB, where="x")  # FSDP2 at 2 ranks 15.375, at 3 14.125
    assert err.value.key == "data.seq_len" and str(err.value).endswith(
        "it fits with any one of: data.seq_len=688; 3 ranks (--nproc-per-node, or more nodes) with "
        "distributed.strategy=fsdp (KILN_SKIP_MEMORY_CHECK=1 tries anyway)")
    with pytest.raises(ConfigError, match="no single setting makes it fit"):
        check_fits(plan, one, free=GIB, capacity=GIB, where="x")


@pytest.mark.parametrize(("extra", "widths", "micro"), [
    (["distributed.strategy=fsdp", "precision.policy=bf16-mixed", "compile.enabled=true"], Widths(2, 2),
     Micro(2, 256, "fused", "flash", compiled=True)),  # FSDP2 gathers bf16: a bf16 residual stream
    (["precision.policy=bf16-mixed", "training.swiglu_kernel=plain", "model.attention=efficient"], Widths(4, 2),
     Micro(2, 256, "plain", "efficient")),  # one process: fp32 weights and residual, bf16 matmuls
])
def test_kiln_decoders_are_counted_from_their_shapes(extra, widths, micro):
    cfg = load_config(None, ["model.name=llama:llama-tiny", "data.batch_size=2", "data.seq_len=256",
                             "training.activation_checkpointing=selective", *extra])
    strategy = "fsdp" if "distributed.strategy=fsdp" in extra else "none"
    built = meta_model(cfg)
    setup = gpu_plan.run_setup(cfg, strategy, 2 if strategy == "fsdp" else 1, resolve_precision("bf16-mixed", torch.device("cpu")), 0)
    m = gpu_plan.measure(built, cfg, setup)
    assert m.acts is None and m.dims == DecoderDims(2, 64, 4, 2, 16, 128, 512)
    plan = plan_of(m, setup, checkpointing="selective", batch=2, seq=256)
    assert plan.parts["activations"] == activations_saved(m.dims, widths, micro, "selective")
    assert plan.parts["logits + loss"] == loss_saved(m.dims, widths, 512, "chunked", autocast=True)
    assert plan.parts["loss transient"] == 2 * 512 * 512 * widths.matmul  # one chunk (all 512 tokens) and its gradient
    assert plan.parts["backward transient"] == recompute_bytes(m.dims, widths, micro, "selective")
    assert not plan.notes


def test_the_8b_plans_are_within_10_percent_of_the_measured_peaks():
    """The 8B rows of benchmarks/results/h100x4/llm_train_8b (4 x H100, FSDP2, seq 8192, selective):
    their measured allocated peaks against what this plan says for their configs."""
    results = json.loads((Path(__file__).parents[2] / "benchmarks/results/h100x4/llm_train_8b/results.json").read_text())
    rows = {r["row"]: r for r in results["results"] if r.get("memory_plan")}
    for name, policy in (("kiln-sel", "bf16-mixed"), ("kiln-master-sel", "bf16-master")):
        cfg = load_config(None, ["model.name=llama:llama-3.1-8b", "distributed.strategy=fsdp", "data.seq_len=8192",
                                 "data.batch_size=1", "compile.enabled=true", "compile.regional=true",
                                 "training.activation_checkpointing=selective", f"precision.policy={policy}"])
        plan = gpu_plan.plan_run(cfg, "fsdp", 4, resolve_precision(policy, torch.device("cpu")), memory=None, where="x", announce=False)
        measured = rows[name]["memory_plan"]["measured"]
        assert 0.9 <= measured["max_allocated_bytes"] / plan.total <= 1.1, (name, plan.total)
        assert 0.85 <= measured["max_reserved_bytes"] / plan.reserved <= 1.0, (name, plan.reserved)


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
    assert err.startswith("kiln: error: model.name: this run needs about 1.5 GiB per rank (none, 1 rank: ")
    assert "no single setting makes it fit" in err and not run_dir.exists()


def test_summary_keeps_the_plan_and_the_measured_peak(tmp_path):
    from kiln.train.trainer import train

    train(load_config(None, ["model.name=llama:llama-tiny", "training.device=cpu", "data.seq_len=32",
                             "data.batch_size=2", "training.steps=1", "metrics.console=false",
                             "metrics.tensorboard=false"]), tmp_path / "run")
    record = json.loads((tmp_path / "run" / "summary.json").read_text())["memory_plan"]
    assert set(record) == {"parts", "total_bytes", "phases", "slack_bytes", "reserved_bytes", "strategy",
                           "world_size", "setup", "checkpointing", "notes", "measured"}
    assert record["strategy"] == "none" and record["world_size"] == 1 and record["measured"] is None  # CPU
    assert record["checkpointing"] == "none"
    assert record["total_bytes"] == max(record["phases"].values())
    assert record["reserved_bytes"] == record["total_bytes"] + record["slack_bytes"]
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


def _plan_8b(*extra: str, capacity: int | None, free: int | None = None):
    cfg = load_config(None, ["model.name=llama:llama-3.1-8b", "distributed.strategy=fsdp", "data.seq_len=8192",
                             "data.batch_size=1", "compile.enabled=true", "compile.regional=true",
                             "training.activation_checkpointing=selective", "precision.policy=bf16-master", *extra])
    memory = None if capacity is None else (capacity if free is None else free, capacity)
    return gpu_plan.plan_run(cfg, "fsdp", 4, resolve_precision("bf16-master", torch.device("cpu")), memory=memory,
                             where="x", announce=False)


def test_auto_keeps_a_large_models_units_gathered_where_the_plan_leaves_room():
    """`fsdp_reshard_after_forward=auto` on the 8B shape (16 GB gathered, over the size rule's 1 GiB):
    an H200's 141 GiB keeps the units gathered (the plan reserves under KEEP_SHARE of it), within
    10 % of the measured peak of that setup (benchmarks/results/h200x4/llm_train_8b_50_steps,
    kiln-master-sel-zero2); an 80 GB GPU, a plan without device figures, an H200 whose free memory
    the kept plan would not fit (the resharded one does), and `true` reshard them."""
    h200, h100 = 143771 * 2**20, 81559 * 2**20
    kept = _plan_8b(capacity=h200)
    assert kept.setup.reshard_after_forward is False and any("kept gathered" in n for n in kept.notes)
    assert kept.reserved <= gpu_plan.KEEP_SHARE * h200
    results = json.loads((Path(__file__).parents[2] / "benchmarks/results/h200x4/llm_train_8b_50_steps/results.json")
                         .read_text())
    row = next(r for r in results["results"] if r["row"] == "kiln-master-sel-zero2")
    assert row["memory_plan"]["setup"]["reshard_after_forward"] is False
    assert 0.9 <= row["memory_plan"]["measured"]["max_allocated_bytes"] / kept.total <= 1.1
    held = _plan_8b(capacity=h200, free=int(kept.reserved * 0.95))  # another process holds most of the GPU
    for plan in (_plan_8b(capacity=h100), _plan_8b(capacity=None), held,
                 _plan_8b("distributed.fsdp_reshard_after_forward=true", capacity=h200)):
        assert plan.setup.reshard_after_forward is True and not plan.notes
        assert plan.total < kept.total  # resharded: the gathered units are freed after forward
    tight = int(kept.reserved / (gpu_plan.KEEP_SHARE + 0.05))  # kept fits, above KEEP_SHARE: auto reshards
    assert _plan_8b(capacity=tight).setup.reshard_after_forward is True
    explicit = _plan_8b("distributed.fsdp_reshard_after_forward=false", capacity=tight)
    assert explicit.setup.reshard_after_forward is False and not explicit.notes
    assert gpu_plan.planned_reshard(kept, "fsdp") is False and gpu_plan.planned_reshard(kept, "ddp") is None
    assert gpu_plan.planned_reshard(None, "fsdp") is None


def test_auto_checkpointing_takes_the_least_recomputation_the_plan_fits():
    """`training.activation_checkpointing=auto` on the 8B shape at 4 ranks: none on an H200's 141 GiB, selective
    on an 80 GB H100 (none does not fit there), full where only full fits, none without device figures; an
    explicit mode is kept; the choice is a note of the plan and what `planned_checkpointing` returns."""
    h200, h100 = 143771 * 2**20, 81559 * 2**20
    plans = {mode: _plan_8b(f"training.activation_checkpointing={mode}", capacity=None)
             for mode in ("none", "selective", "full")}
    between = int(plans["full"].reserved / (1 - HEADROOM)) + 2**20  # full fits, selective does not (resharded)
    assert plans["selective"].reserved > between
    for capacity, chosen in ((h200, "none"), (h100, "selective"), (between, "full"), (None, "none")):
        plan = _plan_8b("training.activation_checkpointing=auto", capacity=capacity)
        assert plan.checkpointing == chosen and gpu_plan.planned_checkpointing(plan, "auto") == chosen
        assert any(f"activation_checkpointing=auto: {chosen}" in n for n in plan.notes)
    assert gpu_plan.planned_checkpointing(None, "auto") == "none"
    kept = _plan_8b("training.activation_checkpointing=selective", capacity=h200)
    assert kept.checkpointing == "selective" and gpu_plan.planned_checkpointing(kept, "selective") == "selective"
    assert not any("activation_checkpointing=auto" in n for n in kept.notes)
    assert _plan_8b("training.activation_checkpointing=auto", capacity=h200).setup.reshard_after_forward is True


def test_auto_checkpointing_reaches_the_blocks_and_the_summary(tmp_path, monkeypatch):
    """A run whose device plan fits only with full checkpointing (device figures given to a CPU run) applies
    full to its blocks under `auto` and keeps the choice in summary.json; without figures it is none."""
    from kiln.train import assemble
    from kiln.train.trainer import train

    base = ["model.name=llama:llama-tiny", "training.device=cpu", "data.seq_len=64", "data.batch_size=8",
            "training.steps=1", "metrics.console=false", "metrics.tensorboard=false"]
    policy = resolve_precision("fp32", torch.device("cpu"))
    reserved = {mode: gpu_plan.plan_run(load_config(None, [*base, f"training.activation_checkpointing={mode}"]),
                                        "none", 1, policy, memory=None, where="x", announce=False).reserved
                for mode in ("selective", "full")}
    assert reserved["full"] < reserved["selective"]
    capacity = int(reserved["full"] / (1 - HEADROOM)) + 1024
    applied = []
    monkeypatch.setattr(assemble, "apply_activation_checkpointing", lambda blocks, mode: applied.append(mode))
    for memory, expect in (((capacity, capacity), "full"), (None, "none")):
        monkeypatch.setattr(build_run, "device_memory", lambda device, memory=memory: memory)
        run = tmp_path / expect
        train(load_config(None, [*base, "training.activation_checkpointing=auto"]), run)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["features"]["activation_checkpointing"] == expect == applied[-1]
        assert summary["memory_plan"]["checkpointing"] == expect
