"""kiln doctor: the first failing stage for a crashing and a drifting backend, inductor bisection, repro."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from kiln.cli.main import main
from kiln.diagnose.bisect import bisector_available
from kiln.diagnose.doctor import run_doctor
from kiln.diagnose.target import load_target

from .conftest import PLANTED, marker_line, target

STAGE_KEYS = {"backend", "status", "max_abs_err", "max_rel_err", "error"}


def _doctor_json(tmp_path, *args):
    out = tmp_path / "doctor.json"
    code = main(["doctor", target("relu_net"), "--out", str(tmp_path), "--json", str(out), *args])
    return code, json.loads(out.read_text())


def test_crashing_backend_is_the_first_failure(tmp_path):
    code, report = _doctor_json(tmp_path, "--stages", "eager,aot_eager", "--backend", "relu_compile_error_TESTING_ONLY")
    assert code == 1
    assert [s["status"] for s in report["stages"]] == ["ok", "ok", "crash"]
    assert all(STAGE_KEYS <= set(s) for s in report["stages"])
    first = report["first_failure"]
    assert first["backend"] == "relu_compile_error_TESTING_ONLY" and first["status"] == "crash"
    assert "ReluCompileError" in first["error"]
    assert report["repro"] is not None and report["repro"].endswith(".py")


def test_crash_in_a_user_backend_names_its_line(tmp_path):
    code, report = _doctor_json(tmp_path, "--stages", "eager", "--backend", f"{PLANTED}:crash_backend", "--no-repro")
    first = report["first_failure"]
    assert code == 1 and first["status"] == "crash" and "planted backend crash" in first["error"]
    assert first["where"]["line"] == marker_line('raise RuntimeError("planted backend crash")')
    assert report["repro"] is None


def test_drifting_backend_fails_the_harness_rule_with_train(tmp_path):
    code, report = _doctor_json(tmp_path, "--stages", "eager,aot_eager", "--backend", f"{PLANTED}:drift_backend",
                                "--train")
    assert code == 1
    eager, aot, drift = report["stages"]
    assert eager["status"] == aot["status"] == "ok" and eager["max_abs_err"] == 0.0
    assert drift["status"] == "accuracy_fail" and drift["max_abs_err"] == pytest.approx(1e-2, rel=1e-3)
    assert report["first_failure"]["backend"].endswith("drift_backend") and report["reference"] == "fp64+eager"
    assert report["tol"] == 1e-3
    # The repro script reproduces the drift on its own (exit status 1).
    proc = subprocess.run([sys.executable, report["repro"]], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr


def test_inductor_bug_is_found_and_bisected(tmp_path):
    import torch._inductor.config as inductor_config

    # torch's own planted inductor bug: relu lowered wrongly (used by torch's bisector/minifier tests).
    with inductor_config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "accuracy"}):
        report = run_doctor(load_target(target("relu_net")), out_dir=tmp_path)
    assert [s["backend"] for s in report["stages"]] == ["eager", "aot_eager", "aot_eager_decomp_partition", "inductor"]
    assert [s["status"] for s in report["stages"]] == ["ok", "ok", "ok", "accuracy_fail"]
    assert report["first_failure"]["backend"] == "inductor"
    if bisector_available():
        assert report["bisect"]["status"] == "found"
        assert report["bisect"]["backend"] == "inductor" and report["bisect"]["subsystem"] == "lowerings"
    script = (tmp_path / "kiln_repro_inductor.py").read_text()
    assert "inject_relu_bug_TESTING_ONLY" in script  # the non-default config travels with the repro


def test_seed_all_reduce_model_passes_the_early_stages(tmp_path):
    from .conftest import EXAMPLES

    report = run_doctor(load_target(f"{EXAMPLES / 'seed_all_reduce.py'}:build"), stages=["eager", "aot_eager"],
                        out_dir=tmp_path)
    assert report["first_failure"] is None
    (row,) = report["seed_expectations"]
    assert row["expected_failure"] == "inductor" and "not run" in row["note"]
    assert not torch.distributed.is_initialized()


def test_repro_of_a_distributed_model_sets_up_its_process_group_and_reproduces(tmp_path):
    from .conftest import EXAMPLES

    report = run_doctor(load_target(f"{EXAMPLES / 'seed_all_reduce.py'}:build"), stages=["eager"],
                        backends=[f"{PLANTED}:drift_backend"], out_dir=tmp_path)
    assert any("gloo" in note for note in report["notes"])
    script = report["repro"]
    assert "NEEDS_PROCESS_GROUP = True" in open(script).read()
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "reproduced: accuracy failure" in proc.stdout and "process group" not in proc.stderr
    # A script that cannot even load the model says so, with its own exit status.
    text = open(script).read().replace("TARGET = ", "TARGET = 'no_such_module_for_kiln:build'  # ", 1)
    open(script, "w").write(text)
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "could not set up the repro" in proc.stdout, proc.stdout + proc.stderr



@pytest.mark.skipif(not torch.__version__.startswith("2.13"), reason="examples/README.md describes torch 2.13 (CPU)")
def test_what_examples_readme_says_doctor_finds_on_the_seed_model_is_what_it_finds(tmp_path):
    """examples/README.md's two doctor findings on seed_all_reduce, run as written: forward only, every
    stage matches; with --train, inductor alone drifts on conv1's gradients and the repro script it
    writes reproduces that by itself (exit 1)."""
    from .conftest import EXAMPLES

    readme = (EXAMPLES / "README.md").read_text()
    assert "every stage, inductor included, matches eager" in readme and "gradients of `conv1`" in readme
    spec = f"{EXAMPLES / 'seed_all_reduce.py'}:build"
    forward = run_doctor(load_target(spec), out_dir=tmp_path / "fwd")
    assert [(s["backend"], s["status"]) for s in forward["stages"]] == [
        ("eager", "ok"), ("aot_eager", "ok"), ("aot_eager_decomp_partition", "ok"), ("inductor", "ok")]
    train = run_doctor(load_target(spec), train=True, out_dir=tmp_path / "train")
    assert [s["status"] for s in train["stages"]] == ["ok", "ok", "ok", "accuracy_fail"]
    assert train["first_failure"]["backend"] == "inductor"
    assert set(train["first_failure"]["failing"]) == {"grad:conv1.weight", "grad:conv1.bias"}
    proc = subprocess.run([sys.executable, train["repro"]], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path / "train")
    assert proc.returncode == 1 and "reproduced: accuracy failure" in proc.stdout, proc.stdout + proc.stderr[-2000:]
