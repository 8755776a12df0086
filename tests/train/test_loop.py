"""kiln.train.loop: the training loop driven one step at a time, and the step's FLOP count."""

from __future__ import annotations

from kiln.checkpoint import StopOnSignal
from kiln.config import load_config
from kiln.train.loop import TrainLoop, count_flops
from kiln.train.trainer import Trainer


class _Sinks:
    def __init__(self):
        self.records: list[dict] = []

    def log(self, record: dict) -> None:
        self.records.append(record)

    def waiting(self, message: str) -> None:
        pass


def _loop(tmp_path, tiny_overrides, *more: str) -> tuple[Trainer, TrainLoop, _Sinks]:
    cfg = load_config(None, [*tiny_overrides, "training.steps=7", "training.log_interval=3", *more])
    trainer = Trainer(cfg, tmp_path / "run")
    sinks = _Sinks()
    trainer.loop.prepare(sinks, health=None)  # fit starts the GPU health sampler; none on CPU
    return trainer, trainer.loop, sinks


def test_one_step_at_a_time_logs_the_first_every_interval_and_the_last(tmp_path, tiny_overrides):
    trainer, loop, sinks = _loop(tmp_path, tiny_overrides)
    with StopOnSignal() as stop:
        for step in range(1, 8):
            assert loop.one_step(step, stop) is True
            assert loop.progress.step == loop.progress.done == step
            assert loop.app.progress["step"] == step
            assert loop.app.progress["samples_seen"] == step * 16
    assert [r["step"] for r in sinks.records] == [1, 3, 6, 7]
    assert loop.summary()["steps"] == 7
    trainer.leave_group()


def test_a_stop_request_saves_a_checkpoint_and_ends_the_loop(tmp_path, tiny_overrides):
    trainer, loop, _ = _loop(tmp_path, tiny_overrides)
    with StopOnSignal() as stop:
        assert loop.one_step(1, stop) is True
        stop.stop_requested = lambda: True
        assert loop.one_step(2, stop) is False
    assert loop.stopped_by == "signal"
    assert (tmp_path / "run" / "checkpoints" / "step_00000002").is_dir()
    trainer.leave_group()


def test_flops_are_counted_per_step_with_gradient_accumulation(tmp_path, tiny_overrides):
    trainer, loop, _ = _loop(tmp_path, tiny_overrides)
    p = trainer.parts
    batch = next(iter(p.train_data))
    how = {"task": p.built.task, "ce_kernel": p.features.ce_kernel, "policy": p.policy, "device": p.device}
    one = count_flops(p.model, batch, **how, accum=1)
    assert count_flops(p.model, batch, **how, accum=3) == 3 * one > 0
    assert loop.meter.flops_per_step == one  # metrics.mfu=true, the default: counted for the meter
    trainer.leave_group()
    other, no_mfu, _ = _loop(tmp_path / "no-mfu", tiny_overrides, "metrics.mfu=false")
    assert no_mfu.meter.flops_per_step is None
    other.leave_group()



def test_a_classifiers_flops_are_counted_on_two_samples_and_equal_the_whole_batchs(tmp_path, tiny_overrides):
    """Counting on two samples (seconds, not a CPU minute of the whole batch under the counter)
    gives the whole batch's count: a classifier's FLOPs are per sample."""
    from kiln.monitor.flops import count_step_flops
    from kiln.precision import with_precision
    from kiln.train.losses import build_forward_loss

    trainer, loop, _ = _loop(tmp_path, tiny_overrides)
    p = trainer.parts
    inputs, targets = batch = next(iter(p.train_data))
    forward_loss = with_precision(build_forward_loss(p.model, "classification"), p.policy, p.device)
    whole = count_step_flops(lambda: forward_loss(inputs, targets).backward(), device=p.device, module=p.model)
    p.model.zero_grad(set_to_none=True)
    counted = count_flops(p.model, batch, task=p.built.task, ce_kernel=p.features.ce_kernel, policy=p.policy,
                          device=p.device, accum=1)
    assert inputs.shape[0] == 16 and counted == whole > 0
    trainer.leave_group()


def test_piped_console_says_what_each_phase_before_the_first_record_does(tmp_path, tiny_overrides, capsys):
    """With the console piped (no terminal), a line says each phase before the first record: the
    FLOP count, building the step, the compile, so a minute of work is never silent."""
    from kiln.cli.main import main

    over = [o for o in tiny_overrides if not o.startswith("metrics.console")]
    assert main(["train", "--run-dir", str(tmp_path / "run"), *over, "training.steps=2", "metrics.console=true"]) == 0
    out = capsys.readouterr().out  # the console sink's lines go to stdout
    phases = ["counting the training step's FLOPs", "building the training step", "step 1/2"]
    positions = [out.find(p) for p in phases]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), out[-2000:]
