"""Whole-step capture (kiln.train.capture) on CPU: the captured body, replayed through a graph
stand-in that re-runs it, must give eager's trajectory, LR schedule and guard verdicts; the
fallbacks (no CUDA, failed capture, another batch shape) must train on, saying why."""

from __future__ import annotations

import json
import math

import pytest
import torch

import kiln.train.assemble as assemble
import kiln.train.capture as capture
from kiln.config import load_config
from kiln.config.schema import OptimConfig
from kiln.train.optim import lr_factor, lr_factor_tensor
from kiln.train.trainer import train


class ReplayedGraph:
    """CPU stand-in for a CUDA graph: capture records the body without running it (as a real
    capture records kernels without executing them); replay runs it again on the same tensors."""

    captures = 0

    def capture(self, body):
        ReplayedGraph.captures += 1
        self.body = body

    def replay(self):
        self.body()


class FailingGraph:
    def capture(self, body):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")


@pytest.fixture
def graph(monkeypatch):
    """Pretend this CPU can capture, with the given stand-in graph."""

    def use(factory):
        monkeypatch.setattr(assemble, "capture_problem", lambda device, strategy: None)
        monkeypatch.setattr(capture, "CudaGraph", factory)

    return use


def _losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _lrs(run_dir):
    return [json.loads(line)["lr"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


BASE = ["training.deterministic=true", "optim.warmup_steps=5", "optim.schedule=cosine", "training.log_interval=3",
        "training.steps=24"]


def _pair(tmp_path, tiny_overrides, extra):
    eager = train(load_config(None, [*tiny_overrides, *BASE, *extra]), tmp_path / "eager")
    captured = train(load_config(None, [*tiny_overrides, *BASE, *extra, "compile.cudagraphs=true"]), tmp_path / "cap")
    return eager, captured


@pytest.mark.parametrize("extra", [[], ["training.grad_accum_steps=2"], ["model.kwargs.dropout=0.1"],
                                   ["precision.policy=bf16-mixed"], ["training.nonfinite=skip"],
                                   ["compile.enabled=true", "compile.scope=step"]],
                         ids=["fp32", "accum2", "dropout", "bf16", "skip-policy", "compiled-step"])
def test_replayed_whole_step_matches_the_normal_step(tmp_path, tiny_overrides, graph, extra):
    graph(ReplayedGraph)
    before = ReplayedGraph.captures
    eager, captured = _pair(tmp_path, tiny_overrides, extra)
    assert ReplayedGraph.captures == before + 1
    assert captured["compile"]["cudagraphs"] == "captured"
    assert _losses(tmp_path / "cap") == pytest.approx(_losses(tmp_path / "eager"), rel=1e-5, abs=1e-6)
    # The LR the device schedule wrote equals LambdaLR's at every logged step.
    assert _lrs(tmp_path / "cap") == pytest.approx(_lrs(tmp_path / "eager"), rel=1e-6)
    assert captured["final_loss"] < captured["first_loss"]


def test_on_cpu_whole_step_capture_falls_back_and_says_why(tmp_path, tiny_overrides):
    eager, captured = _pair(tmp_path, tiny_overrides, [])
    assert captured["compile"]["cudagraphs"].startswith("fallback: needs a CUDA device")
    assert _losses(tmp_path / "cap") == pytest.approx(_losses(tmp_path / "eager"), rel=1e-6)


def test_a_failed_capture_falls_back_and_trains_on(tmp_path, tiny_overrides, graph, caplog):
    graph(FailingGraph)
    eager, captured = _pair(tmp_path, tiny_overrides, [])
    status = captured["compile"]["cudagraphs"]
    assert status.startswith("fallback: capture failed (RuntimeError: CUDA error: operation not permitted")
    assert "host sync" in status
    assert any("running the normal step from here on" in r.message for r in caplog.records)
    assert _losses(tmp_path / "cap") == pytest.approx(_losses(tmp_path / "eager"), rel=1e-5, abs=1e-6)
    assert _lrs(tmp_path / "cap") == pytest.approx(_lrs(tmp_path / "eager"), rel=1e-6)


def test_a_nan_inside_the_captured_step_is_caught_at_its_step(tmp_path, tiny_overrides, graph, monkeypatch):
    from kiln.checkpoint import NonFiniteError

    graph(ReplayedGraph)
    real = torch.nn.functional.cross_entropy
    calls = {"n": 0}

    def poisoned(logits, targets, *a, **k):
        calls["n"] += 1
        loss = real(logits, targets, *a, **k)
        return loss * float("nan") if calls["n"] == 7 else loss  # step 7: after capture (warm-up 3 + capture)

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", poisoned)
    with pytest.raises(NonFiniteError) as err:
        # metrics.mfu=false: FLOP counting would call the loss once before step 1.
        train(load_config(None, [*tiny_overrides, *BASE, "compile.cudagraphs=true", "metrics.mfu=false"]),
              tmp_path / "nan")
    # The body runs once per call (warm-up 1-3, capture records without running, replays 4...):
    # the 7th call of the loss is step 7, and the guard names it from its device step counter.
    assert err.value.step == 7


def test_a_batch_of_another_shape_runs_uncaptured(graph, tiny_overrides):
    graph(ReplayedGraph)
    from kiln.checkpoint import NonFiniteGuard
    from kiln.models import build_model
    from kiln.precision import resolve_precision
    from kiln.train.assemble import build_train_step

    cfg = load_config(None, [*tiny_overrides, "compile.cudagraphs=true"])
    built = build_model(cfg.model)
    policy = resolve_precision("fp32", torch.device("cpu"))
    guard = NonFiniteGuard("error", 10)
    step = build_train_step(built.module, built.task, built.blocks, cfg, policy, torch.device("cpu"), guard=guard)
    x = torch.randn(16, *built.input_spec.shape)
    y = torch.randint(0, built.input_spec.num_classes, (16,))
    losses = [float(step([(x, y)])[0]) for _ in range(5)]
    assert step.capture_status == "captured"
    short = float(step([(x[:8], y[:8])])[0])
    assert step.capture_status.startswith("captured (1 step(s) of another batch shape")
    assert math.isfinite(short) and all(math.isfinite(v) for v in losses)
    assert step.scheduler.last_epoch == 6
    assert guard.check() == {"nonfinite_skipped": 0, "nonfinite_consecutive": 0}


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
@pytest.mark.parametrize("warmup", [0, 4])
def test_device_lr_schedule_equals_the_host_one(schedule, warmup):
    cfg = OptimConfig(schedule=schedule, warmup_steps=warmup, min_lr_ratio=0.05)
    steps = torch.arange(0, 40, dtype=torch.float64)
    device = lr_factor_tensor(steps, 30, cfg)
    host = torch.tensor([lr_factor(int(s), 30, cfg) for s in steps], dtype=torch.float64)
    assert torch.allclose(device, host, rtol=1e-12, atol=1e-15)
