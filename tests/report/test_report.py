"""kiln report on a real CPU run (every plot present), a profile dir, and bench results dirs."""

from __future__ import annotations

import base64
import json
import re

import pytest

from kiln.cli.main import main
from kiln.config import load_config
from kiln.train.trainer import train

PNG = b"\x89PNG\r\n\x1a\n"


def _images(html: str) -> dict[str, bytes]:
    found = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">', html)
    return {alt: base64.b64decode(data) for alt, data in found}


def _png_size(png: bytes) -> tuple[int, int]:
    assert png.startswith(PNG)
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("report") / "run"
    over = ["model.kwargs.hidden_size=32", "model.kwargs.num_layers=2", "model.kwargs.num_classes=4",
            "data.batch_size=16", "training.steps=20", "training.log_interval=4", "training.device=cpu",
            "training.eval_interval=10", "metrics.console=false", "metrics.tensorboard=false"]
    train(load_config(None, over), run_dir)
    return run_dir


def test_cpu_run_report_has_every_plot(cpu_run, capsys):
    assert main(["report", str(cpu_run)]) == 0
    assert "report.html" in capsys.readouterr().out
    html = (cpu_run / "report.html").read_text()
    images = _images(html)
    assert set(images) == {"Loss over steps", "Throughput over steps", "MFU over steps", "Memory over steps",
                           "GPU health over steps"}
    for png in images.values():
        width, height = _png_size(png)
        assert width >= 600 and height >= 250
    assert "<table>" in html and "step ms, median" in html
    assert "src=\"http" not in html and "<script" not in html  # self-contained
    md = (cpu_run / "report.md").read_text()
    for name in ("loss", "throughput", "mfu", "memory", "gpu_health"):
        assert f"(report_files/{name}.png)" in md
        assert (cpu_run / "report_files" / f"{name}.png").read_bytes().startswith(PNG)


def test_report_elsewhere_leaves_the_run_dir_alone(cpu_run, tmp_path):
    before = sorted(p.name for p in cpu_run.iterdir())
    assert main(["report", str(cpu_run / "metrics.jsonl"), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.html").exists()
    assert sorted(p.name for p in cpu_run.iterdir()) == before


def test_distributed_records_get_the_per_rank_plot(tmp_path):
    run = tmp_path / "dist"
    run.mkdir()
    records = [{"step": s, "loss": 1.0 / s, "samples_per_s": 100.0, "step_ms": 10.0, "step_ms_ranks": [10.0, 10.0],
                "own_ms_ranks": [4.0, 9.5], "sync_wait_ms_ranks": [6.0, 0.5], "stragglers": [1] if s > 2 else []}
               for s in (1, 2, 3, 4)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "summary.json").write_text(json.dumps({"status": "completed", "world_size": 2, "stragglers_seen": [1]}))
    assert main(["report", str(run)]) == 0
    assert "Per-rank timing over steps" in _images((run / "report.html").read_text())


def test_bench_results_report_table_and_charts(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    rows = [
        {"model": "mlp", "precision": "fp32", "loss": "task", "mode": "eager", "status": "ok", "step_ms": 9.5,
         "speedup": 1.0, "peak_mem_bytes": 400 * 2**20},
        {"model": "mlp", "precision": "fp32", "loss": "task", "mode": "reduce-overhead", "status": "ok",
         "step_ms": 3.1, "eager_step_ms": 9.486, "speedup": 3.06, "peak_mem_bytes": 380 * 2**20, "noisy": True,
         "flags": "noisy step: p10-p90 too wide to rank"},
        {"model": "mlp", "precision": "fp32", "loss": "task", "mode": "max-autotune", "status": "oom",
         "reason": "CUDA out of memory", "step_ms": None, "speedup": None},
    ]
    (bench / "results.json").write_text(json.dumps({"env": {"torch": "2.11"}, "config": {}, "command": "kiln bench",
                                                    "results": rows}))
    assert main(["report", str(bench)]) == 0
    html = (bench / "report.html").read_text()
    assert "CUDA out of memory" in html and "reduce-overhead" in html and "400.0 MiB" in html
    images = _images(html)
    assert any("speedup" in alt for alt in images) and any("step time" in alt for alt in images)
    md = (bench / "report.md").read_text()
    assert "| mode |" in md and "| oom |" in md
    # Each speedup beside the eager time it divides, and the noise flag.
    assert "| eager_step_ms |" in md and "9.486" in md and "noisy step: p10-p90 too wide to rank" in md


def test_generic_results_follow_the_contract(tmp_path):
    bench = tmp_path / "llm"
    bench.mkdir()
    rows = [{"engine": "hf", "quant": "none", "status": "ok", "decode_tok_s": 34.0, "prefill_tok_s": 29000.0},
            {"engine": "kiln", "quant": "none", "status": "ok", "decode_tok_s": 380.0, "prefill_tok_s": 41000.0}]
    (bench / "results.json").write_text(json.dumps({"env": {}, "config": {}, "results": rows}))
    assert main(["report", str(bench)]) == 0
    images = _images((bench / "report.html").read_text())
    assert any("decode tokens/s" in alt for alt in images)


@pytest.mark.parametrize(("make", "needle"), [
    (lambda p: None, "does not exist"),
    (lambda p: p.mkdir(), "neither a run"),
    (lambda p: (p.mkdir(), (p / "results.json").write_text("{}")), "no `results` list"),
    (lambda p: (p.mkdir(), (p / "summary.json").write_text("{not json")), "not readable JSON"),
])
def test_bad_input_exits_2(tmp_path, capsys, make, needle):
    target = tmp_path / "x"
    make(target)
    assert main(["report", str(target)]) == 2
    assert needle in capsys.readouterr().err


def test_profile_dir_report_has_the_profile_section(tmp_path):
    out = tmp_path / "prof"
    assert main(["profile", "--out", str(out), "--steps", "2", "--warmup", "1", "--memory-steps", "1",
                 "model.kwargs.hidden_size=32", "model.kwargs.num_layers=2", "training.device=cpu",
                 "metrics.console=false"]) == 0
    assert main(["report", str(out)]) == 0
    html = (out / "report.html").read_text()
    assert "<h2>Profile</h2>" in html and "GPU figures: n/a" in html and "memory category" in html


def test_a_resumed_runs_report_names_its_segments_and_whole_wall_time(tmp_path):
    run = tmp_path / "resumed"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 2.0 / s, "samples_per_s": 100.0,
                                                           "step_ms": 10.0}) + "\n" for s in (1, 4, 8)))
    segments = [{"first_step": 1, "last_step": 4, "wall_s": 12.5, "status": "stopped", "stopped_by": "SIGTERM"},
                {"first_step": 5, "last_step": 8, "wall_s": 7.5, "status": "completed"}]
    (run / "summary.json").write_text(json.dumps({"status": "completed", "steps": 8, "first_loss": 2.0,
                                                  "final_loss": 0.25, "resumed": True, "segments": segments,
                                                  "wall_s": 20.0, "wall_s_complete": True}))
    assert main(["report", str(run)]) == 0
    md = (run / "report.md").read_text()
    assert "| wall time, s (all segments) | 20 |" in md
    assert ("| resumed | 2 segments: steps 1-4 (stopped, SIGTERM, 12.5 s); steps 5-8 (completed, 7.5 s) |"
            in md), md
    assert "| loss (first → final) | 2.0000 → 0.2500 |" in md


def test_the_validation_table_says_what_it_shows_and_keeps_the_best_pass():
    from kiln.report.contents import validation_blocks
    from kiln.report.render import Para, Table

    recs = [{"step": 10 * i, "loss": 3.0, "eval_loss": 3.0 - 0.01 * i} for i in range(1, 21)]
    recs[13]["eval_loss"] = 1.0  # the best pass, at step 140: not one of the 12 evenly spaced
    _, para, table = validation_blocks(recs)
    assert isinstance(para, Para) and isinstance(table, Table)
    assert "13 of the 20 eval passes" in para.text and "best eval loss, 1.0000, was at step 140" in para.text
    best = [row for row in table.rows if row[-1] == "best eval loss"]
    assert [row[0] for row in best] == [140]
    _, para, table = validation_blocks(recs[:5])
    assert "each of the 5 eval passes" in para.text and len(table.rows) == 5


def test_an_autotune_report_keeps_stage_and_role_and_marks_the_winner(tmp_path):
    rows = [{"stage": "baseline", "candidate": "fp32 default/model", "role": "default", "status": "ok",
             "step_ms": 2.0, "speedup_vs_eager_fp32": 1.5, "mode": "default", "speedup": 1.5},
            {"stage": "confirm", "candidate": "fp32 default/model", "role": "winner", "status": "ok",
             "step_ms": 1.9, "speedup_vs_eager_fp32": 1.6, "mode": "default", "speedup": 1.6,
             "reason": None, "flags": "round to round: 2.0 ms in stage baseline, 1.9 ms in confirm " * 3},
            {"stage": "modes", "candidate": "fp32 max-autotune/model", "role": "", "status": "skipped",
             "reason": "not tried: estimated 900 s, 12 s of the budget left"}]
    (tmp_path / "results.json").write_text(json.dumps({"env": {}, "config": {}, "command": "kiln autotune",
                                                       "results": rows}))
    assert main(["report", str(tmp_path)]) == 0
    html = (tmp_path / "report.html").read_text()
    md = (tmp_path / "report.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| #"))
    assert header.startswith("| # | stage | candidate | role | status")
    assert "reason" not in header and "flags" not in header  # long text goes under the table
    assert '<td class="winner">winner</td>' in html
    assert "2. fp32 default/model [confirm] WINNER: round to round" in md
    assert "3. fp32 max-autotune/model [modes]: not tried: estimated 900 s" in md


def test_a_killed_runs_report_reads_its_config_and_records(tmp_path):
    """A run killed before summary.json (the OOM killer): the report says so, and takes compile and
    precision from config.toml and the losses from metrics.jsonl instead of saying "compile off"."""
    run_dir = tmp_path / "run"
    over = ["model.kwargs.hidden_size=32", "model.kwargs.num_layers=2", "data.batch_size=8", "training.steps=6",
            "training.log_interval=2", "training.device=cpu", "metrics.console=false", "metrics.tensorboard=false"]
    train(load_config(None, over), run_dir)
    (run_dir / "summary.json").unlink()
    text = (run_dir / "config.toml").read_text().replace("[compile]\nenabled = false", "[compile]\nenabled = true")
    (run_dir / "config.toml").write_text(text)
    assert main(["report", str(run_dir)]) == 0
    md = (run_dir / "report.md").read_text()
    assert "No summary.json: the run was killed" in md
    assert "status killed or running (no summary.json), 6 steps" in md and "compile default/model" in md
    assert "compile off" not in md
    assert re.search(r"\| loss \(first → final\) \| \d\.\d{4} → \d\.\d{4} \|", md)
