from __future__ import annotations

import pytest

from kiln.failure import faults
from kiln.failure.faults import Fault, inject, planned_fault


@pytest.mark.parametrize(("spec", "fault"), [
    ("kill@6", Fault("kill", 6)),
    ("hang@3", Fault("hang", 3)),
    ("slow@1:50", Fault("slow", 1, 50.0)),
    ("slow@10:2.5", Fault("slow", 10, 2.5)),
    ("cuda-oom@6", Fault("cuda-oom", 6)),
    ("host-oom@2", Fault("host-oom", 2)),
    ("kill-worker@4", Fault("kill-worker", 4)),
])
def test_parse(monkeypatch, spec, fault):
    monkeypatch.setenv("KILN_FAULT", spec)
    monkeypatch.delenv("KILN_FAULT_RANK", raising=False)
    assert planned_fault(0) == fault


@pytest.mark.parametrize("spec", ["slow@1", "kill@1:5", "slow@x:5", "slow@1:-5", "boom@1"])
def test_bad_spec_names_the_forms(monkeypatch, spec):
    monkeypatch.setenv("KILN_FAULT", spec)
    with pytest.raises(ValueError, match="slow@STEP:MS"):
        planned_fault(0)


def test_only_the_named_rank_and_first_attempt(monkeypatch):
    monkeypatch.setenv("KILN_FAULT", "slow@1:5")
    monkeypatch.setenv("KILN_FAULT_RANK", "1")
    assert planned_fault(0) is None and planned_fault(1) is not None
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert planned_fault(1) is None


def test_slow_sleeps_from_its_step_on(monkeypatch):
    slept = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    fault = Fault("slow", 3, 40.0)
    for step in range(1, 6):
        inject(fault, step)
    assert slept == [0.04, 0.04, 0.04]


def test_raising_faults(monkeypatch):
    import torch

    with pytest.raises(torch.cuda.OutOfMemoryError, match="CUDA out of memory"):
        inject(Fault("cuda-oom", 2), 2)
    with pytest.raises(MemoryError):
        inject(Fault("host-oom", 2), 2)
    inject(Fault("host-oom", 2), 3)  # once, at its step only
    monkeypatch.setattr("multiprocessing.active_children", lambda: [])
    with pytest.raises(RuntimeError, match="no DataLoader worker"):
        inject(Fault("kill-worker", 1), 1)


def test_a_hung_rank_ends_on_sigterm(monkeypatch):
    """The hang sleeps with SIGTERM's default action restored (kiln's own handler would only ask for a
    stop at the next step): torchrun's stop before a restart ends it without waiting out its grace."""
    import signal

    class Slept(Exception):
        pass

    def sleep(seconds):
        raise Slept(signal.getsignal(signal.SIGTERM))

    monkeypatch.setattr(faults.time, "sleep", sleep)
    before = signal.signal(signal.SIGTERM, lambda *_: None)  # as a kiln rank's stop handler
    try:
        inject(Fault("hang", 2), 1)  # not its step: nothing changes
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        with pytest.raises(Slept) as slept:
            inject(Fault("hang", 2), 2)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert slept.value.args == (signal.SIG_DFL,)


@pytest.mark.parametrize("argv", [[], ["--nproc-per-node", "2"]])
def test_a_bogus_fault_is_refused_before_the_run_dir_exists(bad_input, tmp_path, monkeypatch, argv):
    monkeypatch.setenv("KILN_FAULT", "bogus")
    run_dir = tmp_path / "run"
    bad_input(["train", *argv, "--run-dir", str(run_dir), "training.device=cpu"], ["KILN_FAULT", "'bogus'", "kill@STEP"])
    assert not run_dir.exists()
