"""Never lose work, through the trainer and the launcher users call: bitwise resume after a
SIGKILL (2 gloo ranks, elastic restart), the NaN guard, world-size change, timeouts, signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from safetensors.torch import load_file

from kiln.cli.main import main

BASE = [
    "model.kwargs.hidden_size=32", "model.kwargs.num_layers=2", "model.kwargs.num_classes=4",
    "model.kwargs.dropout=0.1", "data.synthetic_samples=256", "data.batch_size=8", "training.steps=12",
    "training.log_interval=2", "training.device=cpu", "training.deterministic=true", "metrics.console=false",
    "metrics.tensorboard=false", "optim.lr=3e-3", "checkpoint.interval=4",
]


def _kiln(*args, env=None, timeout=600):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "kiln", *args], capture_output=True, text=True, env=full_env,
                          timeout=timeout)


def _export(run_dir, out):
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    return load_file(str(out))


def _steps(run_dir):
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sigkill_on_one_rank_then_restart_is_bitwise_exact(tmp_path):
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    proc = _kiln("train", "--nproc-per-node", "2", "--run-dir", str(clean), *BASE, "distributed.strategy=ddp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _kiln("train", "--nproc-per-node", "2", "--max-restarts", "1", "--run-dir", str(crashed), *BASE,
                 "distributed.strategy=ddp", env={"KILN_FAULT": "kill@6", "KILN_FAULT_RANK": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((crashed / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["resumed_from"].endswith("step_00000004")
    # Records past the checkpoint were dropped; the resumed segment logs its first step (5) too.
    assert _steps(clean) == [1, 2, 4, 6, 8, 10, 12]
    assert _steps(crashed) == [1, 2, 4, 5, 6, 8, 10, 12]
    a, b = _export(clean, tmp_path / "a.safetensors"), _export(crashed, tmp_path / "b.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].equal(b[key]), key


def _nan_model(tmp_path, at_step):
    src = tmp_path / "nanmodel.py"
    src.write_text(textwrap.dedent(f"""
        import torch
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(8, 4)
                self.calls = 0
            def forward(self, x):
                self.calls += 1
                y = self.lin(x)
                # call n is optimizer step n (kiln counts FLOPs on a copy of the model, of fake tensors)
                return y * float("nan") if self.calls == {at_step} else y
        def make():
            return Net(), {{"kind": "features", "shape": (8,), "num_classes": 4}}
    """))
    return f"model.name={src}:make"


def _no_kwargs(over):
    return [o for o in over if not o.startswith("model.kwargs")]


def test_nan_error_policy_stops_with_step_and_keeps_last_good_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", "--run-dir", str(run_dir), *_no_kwargs(BASE), _nan_model(tmp_path, 5),
                 "training.log_interval=10", "checkpoint.interval=2"])
    err = capsys.readouterr().err
    assert code == 1
    assert "step 5" in err
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["step_00000002", "step_00000004"]  # nothing at or after the bad step
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"


def test_nan_skip_policy_drops_the_update_and_continues(tmp_path):
    run_dir = tmp_path / "run"
    code = main(["train", "--run-dir", str(run_dir), *_no_kwargs(BASE), _nan_model(tmp_path, 5),
                 "training.nonfinite=skip"])
    assert code == 0
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["nonfinite_skipped"] == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_loss"] == summary["final_loss"]  # not NaN


def test_resume_with_another_world_size(tmp_path):
    run_dir = tmp_path / "run"
    proc = _kiln("train", "--nproc-per-node", "2", "--run-dir", str(run_dir), *BASE, "training.steps=8",
                 "distributed.strategy=fsdp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # More steps is another config (the LR schedule spans them): start from the chosen checkpoint.
    code = main(["train", "--run-dir", str(run_dir), *BASE, f"checkpoint.resume={run_dir}/checkpoints/step_00000008"])
    assert code == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["steps"] == 12
    assert summary["resumed_from"].endswith("step_00000008")
    assert _steps(run_dir) == [1, 2, 4, 6, 8, 9, 10, 12]  # the resumed segment logs its first step


def test_resume_from_another_model_is_bad_input_and_changes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "--run-dir", str(run_dir), *BASE, "training.steps=4"]) == 0
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    code = main(["train", "--run-dir", str(run_dir), *BASE, "model.kwargs.hidden_size=48", "checkpoint.resume=auto"])
    err = capsys.readouterr().err
    assert code == 2
    assert "another config" in err and "model.kwargs" in err  # the run dir's config.toml says so first
    # Pointed at the checkpoint itself, the model check names the mismatch.
    code = main(["train", "--run-dir", str(run_dir), *BASE, "model.kwargs.hidden_size=48",
                 f"checkpoint.resume={run_dir}/checkpoints/step_00000004"])
    err = capsys.readouterr().err
    assert code == 2
    assert "step_00000004" in err and "does not match the model" in err and "shape" in err
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before


def test_missing_resume_path_is_bad_input(tmp_path, capsys):
    code = main(["train", "--run-dir", str(tmp_path / "run"), *BASE, f"checkpoint.resume={tmp_path / 'nope'}"])
    assert code == 2
    assert "nope" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_rank_that_stops_participating_times_out_then_the_group_resumes(tmp_path):
    run_dir = tmp_path / "run"
    # 15 s: every collective of the resumed attempt (rendezvous, broadcast, checkpoint load) must
    # also fit in it on a loaded machine. Far below the default, which would outlast the test's own
    # timeout: finishing at all shows the setting was applied.
    proc = _kiln("train", "--nproc-per-node", "2", "--max-restarts", "1", "--run-dir", str(run_dir), *BASE,
                 "distributed.strategy=ddp", "distributed.timeout_s=15",
                 env={"KILN_FAULT": "hang@5", "KILN_FAULT_RANK": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "timed out" in proc.stderr.lower() or "timeout" in proc.stderr.lower()  # the first attempt's end
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from"].endswith("step_00000004")


def test_sigterm_saves_and_exits_cleanly(tmp_path):
    run_dir = tmp_path / "run"
    over = [*BASE, "training.steps=100000", "checkpoint.interval=0", "checkpoint.save_final=false"]
    proc = subprocess.Popen([sys.executable, "-m", "kiln", "train", "--run-dir", str(run_dir), *over],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().count("\n") >= 3:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["stopped_by"] == "SIGTERM"
    assert (run_dir / "checkpoints" / f"step_{summary['steps']:08d}").is_dir()
