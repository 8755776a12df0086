"""The CLI contract: exit codes, one-line errors naming the key, files of the default run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.cli.main import main


def _kiln(*args, cwd=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "kiln", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def test_default_train_reduces_loss(tmp_path):
    proc = _kiln("train", "--run-dir", str(tmp_path / "run"), "metrics.console=false")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert summary["status"] == "completed"
    assert summary["final_loss"] < first["loss"]


def test_log_lines_piped_to_a_file_are_one_record_per_line(tmp_path):
    # stdout is a pipe here (as under Slurm, `| tee` or CI): no live bar, no wrapping.
    proc = _kiln("train", "--run-dir", str(tmp_path / "run"), "training.steps=20", "training.log_interval=10",
                 "model.kwargs.hidden_size=32", "model.kwargs.num_layers=2", "metrics.tensorboard=false")
    assert proc.returncode == 0, proc.stderr
    records = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert [r.split(" | ")[0] for r in records] == ["step 1/20", "step 10/20", "step 20/20"]
    for line in records:
        assert "ms/step" in line and "grad_norm=" in line, line
    assert not any(line.startswith("grad_norm") for line in proc.stdout.splitlines())


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("compile.mode=max-performance", ["compile.mode", "max-autotune"]),
        ("no.such.key=1", ["no"]),
        ("training.stpes=5", ["training.stpes", "steps"]),
        ("training.steps=many", ["training.steps", "integer"]),
        ("precision.policy=fp8", ["precision.policy", "bf16-mixed"]),
        ("compile.backend=nvfuser", ["compile.backend", "inductor"]),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, override, needles, capsys):
    code = main(["train", "--run-dir", str(tmp_path / "run"), override])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    for needle in needles:
        assert needle in err
    assert not (tmp_path / "run").exists()


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml" in capsys.readouterr().err


def test_missing_data_file_exits_2(tmp_path, capsys):
    code = main(["train", "--run-dir", str(tmp_path / "run"), "data.source=files",
                 f"data.path={tmp_path / 'x.npy'}", f"data.labels_path={tmp_path / 'y.npy'}"])
    assert code == 2
    assert "x.npy" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_unknown_command_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bogus"])
    assert exc.value.code == 2


def test_env_json(capsys):
    assert main(["env", "--json"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["torch"]


def test_export_failure_is_one_short_message_with_a_log(tmp_path, monkeypatch, capsys):
    import errno

    import safetensors.torch

    run_dir = tmp_path / "run"
    assert main(["train", "--run-dir", str(run_dir), "training.steps=2", "training.device=cpu", "metrics.console=false",
                 "model.kwargs.hidden_size=32", "model.kwargs.num_layers=1"]) == 0
    capsys.readouterr()

    def full_disk(tensors, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"\0" * 64)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    out = tmp_path / "export" / "model.safetensors"
    assert main(["export", str(run_dir), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kiln: failed: disk full (OSError: [Errno 28] No space left on device)"), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 3
    assert f"traceback in {out.parent / 'error.log'}" in err and "to do: free space" in err
    assert sorted(p.name for p in out.parent.iterdir()) == ["error.log"]  # no half-written .part


def test_bench_failure_is_one_short_message_with_a_log_in_the_output_dir(tmp_path, monkeypatch, capsys):
    def out_of_memory(opts, **progress):
        raise MemoryError()

    monkeypatch.setattr("kiln.bench.compile.compile_command.run_compile_bench", out_of_memory)
    out = tmp_path / "bench"
    assert main(["bench", "compile", "--model", "mlp", "--device", "cpu", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    # What it was doing (piped: one line per phase), then the failure.
    doing, err = err.split("\n", 1)
    assert doing == "kiln: building mlp (train) on cpu"
    assert err.startswith("kiln: failed: out of host memory (MemoryError)"), err
    assert "Traceback" not in err and f"traceback in {out / 'error.log'}" in err
    assert "MemoryError" in (out / "error.log").read_text()


def test_overrides_are_accepted_after_flags(tmp_path, tiny_overrides):
    run_dir = tmp_path / "run"
    # training.steps twice: the later one, after the flags, wins (command-line order).
    code = main(["train", "training.steps=50", *tiny_overrides[:3], "--run-dir", str(run_dir), "cpu.threads=1",
                 *tiny_overrides[3:], "training.steps=3"])
    assert code == 0
    config = (run_dir / "config.toml").read_text()
    assert "steps = 3\n" in config and "threads = 1\n" in config
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 3


def test_an_unknown_flag_among_overrides_is_still_bad_input(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "training.steps=3", "--run-dir", str(tmp_path / "run"), "--bogus", "cpu.threads=1"])
    assert exc.value.code == 2
    assert "--bogus" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_words_after_flags_for_a_command_without_overrides_are_bad_input(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["env", "--json", "extra=1"])
    assert exc.value.code == 2
    assert "extra=1" in capsys.readouterr().err


def test_version_and_help_start_without_torch():
    """`kiln --version` says the version; `kiln --help` (every command's parser) imports no torch,
    as docs/architecture.md promises, so both answer at once."""
    import subprocess
    import sys

    import kiln

    code = ("import sys\nfrom kiln.cli.main import main\n"
            "try:\n    main([sys.argv[1]])\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
            "heavy = sorted(m for m in ('torch', 'numpy', 'transformers') if m in sys.modules)\n"
            "print('imported:', heavy)\n")
    for flag in ("--version", "--help"):
        out = subprocess.run([sys.executable, "-c", code, flag], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "imported: []" in out.stdout, (flag, out.stdout[-300:])
        if flag == "--version":
            assert out.stdout.startswith(f"kiln {kiln.__version__}\n")


def test_doctor_writes_its_repro_into_a_run_dir_not_the_current_directory(tmp_path, monkeypatch, capsys):
    """Without --out, a failing stage's repro script goes to runs/<time>-doctor-<target>/ (named in
    the report), leaving the directory the user runs kiln from (often their source tree) as it was."""
    from tests.diagnose.conftest import PLANTED

    monkeypatch.chdir(tmp_path)
    report = tmp_path / "doctor.json"
    code = main(["doctor", f"{PLANTED}:relu_net", "--stages", "eager", "--backend", f"{PLANTED}:drift_backend",
                 "--no-bisect", "--json", str(report)])
    assert code == 1, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doctor.json", "runs"]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.endswith("-doctor-relu_net")
    repro = json.loads(report.read_text())["repro"]
    assert repro is not None and Path(repro).parent.resolve() == run_dir.resolve()


def test_a_mistyped_flag_is_answered_with_the_closest_flag_of_its_command(bad_input):
    """An unknown flag exits 2 in one line; where a flag of the command that was given (down its
    subcommands) is close, the line names it; a flag close to none gets no guess."""
    err = bad_input(["generate", "--max-new-tokns", "3", "--model", "x"], ["--max-new-tokns"])
    assert err.endswith("(did you mean --max-new-tokens?)")
    assert bad_input(["bench", "llm", "--modle", "x"], ["--modle"]).endswith("(did you mean --model?)")
    assert "did you mean" not in bad_input(["bench", "llm", "--zzz"], ["unrecognized arguments: --zzz"])
