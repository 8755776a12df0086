"""`kiln bench scale | comm | predict` from the command line: a real 2-rank gloo run of the whole
path (points through torchrun, collectives, predictions, results files), and bad input exiting 2
before any work. Values are not asserted (a loaded 2-core machine times nothing reliably): the
structure, statuses and the arithmetic that ties the rows together are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.cli.main import main

ROOT = Path(__file__).parents[2]
TINY = ["model.kwargs.hidden_size=32", "model.kwargs.num_layers=4", "model.kwargs.num_classes=4",
        "model.kwargs.dropout=0.0", "data.batch_size=8", "data.synthetic_samples=128", "training.device=cpu"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _kiln(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "kiln", *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout)


@pytest.fixture(scope="module")
def scale_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("scale") / "out"
    proc = _kiln("bench", "scale", "--nprocs", "1,2", "--strategies", "ddp,fsdp", "--steps", "8",
                 "--comm-repeats", "3", "--predict-worlds", "16,64", "--out", str(out), *TINY)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text()), proc.stdout, proc.stderr


def _rows(results, kind, **match):
    return [r for r in results["results"] if r.get("kind") == kind and all(r.get(k) == v for k, v in match.items())]


def test_points_ran_through_the_launcher_with_efficiency(scale_run):
    out, results, stdout, _ = scale_run
    points = _rows(results, "point")
    assert {(r["variant"], r["world"]) for r in points} == {("none", 1), ("ddp", 1), ("ddp", 2), ("fsdp", 1),
                                                           ("fsdp", 2)}
    assert all(r["status"] == "ok" for r in points), [r.get("reason") for r in points]
    base = _rows(results, "point", role="baseline")[0]
    for r in points:
        assert r["applied_strategy"] == r["strategy"]  # ddp/fsdp really wrapped at one rank too
        assert r["efficiency"] == pytest.approx(r["throughput_per_device"] / base["throughput_per_device"])
        assert (out / "points" / f"{r['variant']}_w{r['world']}" / "summary.json").exists()
    for strategy in ("ddp", "fsdp"):
        two = _rows(results, "point", variant=strategy, world=2)[0]
        one = _rows(results, "point", variant=strategy, world=1)[0]
        assert two["global_batch"] == 16 and two["batch_per_rank"] == 8
        assert two["compute_ms"] == one["step_ms"]
        assert two["exposed_comm_ms"] == pytest.approx(two["step_ms"] - one["step_ms"])
        assert two["threshold"] == 0.85 and two["pass"] == (two["efficiency"] >= 0.85)
        assert two["peak_mem_bytes"] > 0 and two["straggler_ratio"] >= 1.0
    assert "measured" in stdout and "predicted" in stdout


def test_each_phase_is_a_line_on_stderr_as_it_starts(scale_run):
    """Piped (as here), every phase of the minutes a scale run takes is one line on stderr, in order,
    and none on stdout, which keeps the table."""
    _, _, stdout, stderr = scale_run
    phases = [line for line in stderr.splitlines() if line.startswith("kiln: ")]
    traffic = next(i for i, line in enumerate(phases) if "measuring each variant's gradient traffic" in line)
    points = [i for i, line in enumerate(phases) if "] point " in line and "launching its ranks" in line]
    assert len(points) == 5 and traffic < points[0] and "[1/5]" in phases[points[0]] and "[5/5]" in phases[points[-1]]
    assert any("measuring collective bandwidth on 2 ranks" in line for line in phases[points[-1]:])
    assert "launching its ranks" not in stdout


def test_collectives_were_measured_at_the_models_sizes(scale_run):
    _, results, _, _ = scale_run
    comm = _rows(results, "comm")
    assert comm and all(r["status"] == "ok" and r["world"] == 2 for r in comm)
    assert {r["op"] for r in comm} == {"all_reduce", "all_gather", "reduce_scatter"}
    used = {r["used_by"] for r in comm}
    assert any(u.startswith("ddp") for u in used) and any(u.startswith("fsdp") for u in used) and "sweep" in used
    for r in comm:
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
        factor = 1.0 if r["op"] == "all_reduce" else 0.5  # 2(n-1)/n and (n-1)/n at n = 2
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor)
    assert {r["op"] for r in _rows(results, "comm_fit")} == {"all_reduce", "all_gather", "reduce_scatter"}
    (probe,) = _rows(results, "overlap")
    assert 0.0 <= probe["overlap_cost"] <= 1.0


def test_predictions_cover_measured_and_larger_worlds(scale_run):
    out, results, _, _ = scale_run
    for strategy in ("ddp", "fsdp"):
        rows = {r["world"]: r for r in _rows(results, "prediction", variant=strategy)}
        assert set(rows) == {2, 16, 64} and all(r["status"] == "ok" for r in rows.values())
        measured = _rows(results, "point", variant=strategy, world=2)[0]
        assert rows[2]["measured_efficiency"] == measured["efficiency"]
        assert rows[2]["error_points"] == pytest.approx((rows[2]["efficiency"] - measured["efficiency"]) * 100)
        assert rows[2]["t1_source"] == "measured at 1 rank"
        assert rows[2]["bw_source"].startswith("measured")
        assert rows[16]["nodes"] == 8  # a CPU "node" is this 2-core machine
        assert rows[64]["step_ms"] >= rows[16]["step_ms"] - 1e-9
    md = (out / "results.md").read_text()
    for heading in ("## Measured points", "## Collectives at the model's sizes", "## Predictions"):
        assert heading in md
    assert (out / "results.png").stat().st_size > 0


def test_predict_rebuilds_predictions_from_saved_points(scale_run, tmp_path):
    out, results, _, _ = scale_run
    code = main(["bench", "predict", "--points", str(out / "results.json"), "--comm", str(out / "comm" / "results.json"),
                 "--strategies", "ddp", "--calibrate-at", "2", "--device-type", "cpu", "--predict-worlds", "8",
                 "--gpus-per-node", "2", "--out", str(tmp_path / "p"),
                 # The measured gloo bandwidth swings with the machine's load; a given fast link keeps the
                 # model's communication well under the measured 2-rank step, so calibration can reproduce it.
                 "--bus-bw", "1000", "--intra-latency-us", "0.01", *TINY])
    assert code == 0
    rows = [r for r in json.loads((tmp_path / "p" / "results.json").read_text())["results"] if r["kind"] == "prediction"]
    two = next(r for r in rows if r["world"] == 2)
    assert two["t1_source"] == "calibrated on the 2-rank point"
    assert two["error_points"] == pytest.approx(0.0, abs=1e-6)  # the calibration point reproduces itself


def test_committed_h200_points_are_readable_by_predict(tmp_path):
    code = main(["bench", "predict", "--points", str(ROOT / "benchmarks/results/h200x4/scale_vit_b16/results.json"),
                 "--config", str(ROOT / "configs/vit_b16.toml"), "--bus-bw", "344", "--predict-worlds", "8",
                 "--out", str(tmp_path / "p"), "distributed.fsdp_unit_blocks=1"])
    assert code == 0
    rows = json.loads((tmp_path / "p" / "results.json").read_text())["results"]
    measured = {(r["variant"], r["world"]) for r in rows if r["kind"] == "point"}
    assert measured == {("none", 1), ("ddp", 2), ("ddp", 4), ("fsdp", 2), ("fsdp", 4)}
    four = next(r for r in rows if r["kind"] == "prediction" and r["variant"] == "ddp" and r["world"] == 4)
    assert four["t1_source"].startswith("baseline step") and four["measured_efficiency"] == pytest.approx(0.8999, abs=1e-3)


def test_comm_on_one_rank_writes_skipped_rows(tmp_path, capsys):
    assert main(["bench", "comm", "--nprocs", "1", "--out", str(tmp_path / "c"), *TINY]) == 0
    rows = json.loads((tmp_path / "c" / "results.json").read_text())["results"]
    assert rows and all(r["status"] == "skipped" and "no peer" in r["reason"] for r in rows)


@pytest.mark.parametrize(("args", "flag"), [
    (["--strategies", "dpp"], "--strategies"),
    (["--nprocs", "0,2"], "--nprocs"),
    (["--thresholds", "2:850"], "--thresholds"),
    (["--variant", "zero2=fsdp,distributed.fsdp_reshard_after_forward"], "--variant"),
    (["--variant", "ddp=ddp,distributed.ddp_bucket_cap_mb=100"], "--variant"),
    (["--overlap-cost", "2"], "--overlap-cost"),
    (["--steps", "2"], "--steps"),
    (["distributed.fsdp_unit_blocks=-1"], "distributed.fsdp_unit_blocks"),
    (["--variant", "b=ddp,distributed.ddp_bucket_cap_mb=x"], "distributed.ddp_bucket_cap_mb"),
])
def test_bad_input_exits_2_naming_the_flag(tmp_path, capsys, args, flag):
    out = tmp_path / "never"
    assert main(["bench", "scale", "--out", str(out), *TINY, *args]) == 2
    err = capsys.readouterr().err
    assert flag in err and err.count("\n") == 1
    assert not out.exists()


def test_an_existing_results_dir_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "results.json").write_text("{}")
    assert main(["bench", "scale", "--out", str(tmp_path), *TINY]) == 2
    assert "--out" in capsys.readouterr().err
    assert (tmp_path / "results.json").read_text() == "{}"


def test_an_out_held_by_a_running_bench_is_refused_and_untouched(tmp_path, capsys):
    from kiln.outputs import RunDirLock

    out = tmp_path / "out"
    with RunDirLock(out):  # a first bench, still measuring, holds its --out
        assert main(["bench", "scale", "--out", str(out), *TINY]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "in use by a running kiln" in err and err.count("\n") == 1
    assert list(out.iterdir()) == []


def test_an_out_that_cannot_be_written_is_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["bench", "scale", "--out", str(tmp_path / "file" / "out"), *TINY]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "cannot create it" in err and err.count("\n") == 1


def test_ctrl_c_keeps_the_points_written_and_removes_their_checkpoints(tmp_path, capsys, monkeypatch):
    """Ctrl-C after a point was written: results.json (the point) stays, the points' training
    checkpoints (scratch) are removed, the message names both and the command exits 130."""
    from kiln.bench.scale import scale_command

    def interrupted_after_one_point(opts, out, *, on_rows, phase):
        point = out / "points" / "ddp-1"
        (point / "checkpoints" / "step_00000008").mkdir(parents=True)
        (point / "checkpoints" / "step_00000008" / "weights.bin").write_bytes(b"\0" * 1024)
        on_rows([{"kind": "point", "strategy": "ddp", "nprocs": 1, "status": "ok"}])
        raise KeyboardInterrupt

    monkeypatch.setattr(scale_command, "run_scale_bench", interrupted_after_one_point)
    out = tmp_path / "out"
    code = main(["bench", "scale", "--nprocs", "1,2", "--strategies", "ddp", "--steps", "8", "--out", str(out), *TINY])
    err = capsys.readouterr().err
    assert code == 130, err
    assert [r["strategy"] for r in json.loads((out / "results.json").read_text())["results"]] == ["ddp"]
    assert not (out / "points" / "ddp-1" / "checkpoints").exists() and (out / "points" / "ddp-1").is_dir()
    assert "kept results.json" in err and "removed scratch" in err
