"""`kiln advise` on a CPU: planted misaligned dims, an eager-only (graph-breaking) model, a convnet,
the measured figures, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiln.cli.main import main

PLANTED = str(Path(__file__).with_name("planted.py"))
CPU = ["training.device=cpu", "data.batch_size=16"]


def _advise(tmp_path, target, *extra, measure=False):
    out = tmp_path / "advise.json"
    flags = [] if measure else ["--no-measure"]
    assert main(["advise", "--json", str(out), *flags, f"{PLANTED}:{target}", *CPU, *extra]) == 0
    report = json.loads(out.read_text())
    return report, {f["check"]: f for f in report["findings"]}


def _planted_line(tag: str) -> int:
    lines = Path(PLANTED).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if f"# planted: {tag}" in line)


def test_finds_planted_misaligned_dims(tmp_path):
    report, by = _advise(tmp_path, "misaligned")
    found = by["alignment"]
    assert found["status"] == "advice"
    shapes = {(d["layers"][0], d["k"], d["n"]) for d in found["details"]}
    assert shapes == {("0", 100, 30), ("2", 30, 10)}
    first = next(d for d in found["details"] if d["layers"] == ["0"])
    assert first["misaligned"] == {"K (input features)": 100, "N (output features)": 30}
    assert "100 -> 104" in found["fix"] and "30 -> 32" in found["fix"]
    assert report["measured"] is False and found["gain"] is None
    _, ok = _advise(tmp_path, "aligned")
    assert ok["alignment"]["status"] == "ok"


def test_measures_the_cost_of_padding(tmp_path):
    report, by = _advise(tmp_path, "misaligned", measure=True)
    found = by["alignment"]
    assert found["status"] in ("advice", "info")  # which one is this machine's measurement
    for item in found["details"]:
        assert item["as_is_ms"] > 0 and item["padded_ms"] > 0 and item["extra_flops_frac"] > 0
    assert found["gain"] and found["measured"]["gemm_ms_as_is"] > 0
    assert found["measured"]["share_of_step"] is not None
    assert by["data_loader"]["status"] == "ok" and by["data_loader"]["measured"]["data_wait_frac"] >= 0
    assert by["launch_bound"]["status"] == "n/a" and "CPU" in by["launch_bound"]["finding"]
    assert by["precision"]["status"] in ("ok", "advice", "info")
    assert report["measured"] is True


def test_finds_the_graph_breaks_of_an_eager_only_model(tmp_path):
    _, by = _advise(tmp_path, "eager_only")
    found = by["graph_breaks"]
    assert found["status"] == "advice"
    lines = {(d["category"], d["line"]) for d in found["details"]}
    assert {d["file"] for d in found["details"]} == {PLANTED}
    assert _planted_line("branch") in {line for _, line in lines}
    assert _planted_line("item") in {line for _, line in lines}
    assert found["fix"]
    _, clean = _advise(tmp_path, "aligned")
    assert clean["graph_breaks"]["status"] == "ok"


def test_finds_a_data_loader_that_starves_the_step(tmp_path):
    _, by = _advise(tmp_path, "aligned", f"data.source={PLANTED}:slow_data", "data.num_workers=0", measure=True)
    found = by["data_loader"]
    assert found["status"] == "advice"
    assert found["measured"]["data_wait_frac"] > 0.3 and found["gain_frac"] == found["measured"]["data_wait_frac"]
    assert "data.num_workers=" in found["fix"] and "(now 0)" in found["fix"]


def test_channels_last_is_measured_for_a_convnet(tmp_path):
    _, by = _advise(tmp_path, "convnet", measure=True)
    found = by["channels_last"]
    assert found["status"] in ("advice", "info")
    assert found["measured"]["nchw_ms"] > 0 and found["measured"]["channels_last_ms"] > 0
    assert "channels_last" in (found["fix"] or "") or found["status"] == "info"
    _, static = _advise(tmp_path, "misaligned")
    assert static["channels_last"]["status"] == "n/a"


@pytest.mark.parametrize(("args", "needles"), [
    ([], ["TARGET", "--config"]),
    (["no_such_model"], ["TARGET", "no_such_model"]),
    (["mlp", "training.stpes=3"], ["training.stpes", "steps"]),
    (["--config", "missing.toml"], ["missing.toml", "not found"]),
    (["mlp", "precision.policy=fp64"], ["precision.policy", "bf16-mixed"]),
])
def test_bad_input_exits_2_with_one_line(tmp_path, bad_input, args, needles):
    out = tmp_path / "a.json"
    bad_input(["advise", "--json", str(out), *args], needles)
    assert not out.exists()


def test_ctrl_c_stops_advise_not_only_its_inner_run(tmp_path, capsys):
    """Ctrl-C during the short profiled run: advise stops there (not only that run, which would
    print that "the same command continues" its temporary dir), keeps the findings made before it,
    lists the rest as not run and says so."""
    data = str(Path(__file__).with_name("interrupting.py"))
    out = tmp_path / "advise.json"
    code = main(["advise", "--json", str(out), f"{PLANTED}:aligned", *CPU, f"data.source={data}:interrupting_data",
                 "data.num_workers=0", "data.shuffle=false"])
    err = capsys.readouterr().err
    assert code == 0, err
    report = json.loads(out.read_text())
    by = {f["check"]: f for f in report["findings"]}
    assert report["interrupted"] is True
    assert by["graph_breaks"]["status"] == "ok" and by["strategy"]["status"] != "n/a"  # made before: kept
    for check in ("data_loader", "alignment", "precision", "launch_bound"):
        assert by[check]["status"] == "n/a" and "interrupted (Ctrl-C)" in by[check]["finding"], check
    assert "stopped by Ctrl-C" in err and "same command continues" not in err


def test_budget_stops_new_checks_and_keeps_what_was_found(tmp_path, capsys, monkeypatch):
    """--budget 1: the first check runs past the minute (a clock advanced by it), so every later
    check is listed as not run, the first one's finding is kept, and the command says so (exit 0)."""
    import types

    from kiln.advise import advise_run as advise_run
    from kiln.advise import static

    clock = [0.0]
    monkeypatch.setattr(advise_run, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    real = static.check_graph_breaks

    def slow_graph_breaks(*args, **kwargs):
        clock[0] += 120.0  # two minutes pass in the first check
        return real(*args, **kwargs)

    monkeypatch.setattr(static, "check_graph_breaks", slow_graph_breaks)
    report, by = _advise(tmp_path, "aligned", "--budget", "1")
    err = capsys.readouterr().err
    assert report["over_budget"] is True and report["budget_min"] == 1.0 and report["interrupted"] is False
    assert by["graph_breaks"]["status"] == "ok"
    assert by["strategy"]["status"] == "n/a" and "not run: over the --budget" in by["strategy"]["finding"]
    assert "stopped at its --budget of 1 min" in err


def test_a_large_model_measured_on_a_cpu_says_it_takes_minutes(tmp_path, capsys, monkeypatch):
    """From CPU_SLOW_PARAMS parameters, measuring on a CPU without --budget says so before the first
    check, naming --budget and --no-measure; with --budget (or --no-measure) it does not."""
    from kiln.advise import advise_run, static

    def stop(*args, **kwargs):
        raise KeyboardInterrupt  # no need to run the checks: the notice comes before them

    monkeypatch.setattr(static, "check_graph_breaks", stop)
    monkeypatch.setattr(advise_run, "CPU_SLOW_PARAMS", 1)
    _advise(tmp_path, "aligned", measure=True)
    err = capsys.readouterr().err
    assert "parameters on a CPU: each measured check runs the model, minutes each; --budget MIN" in err
    assert "--no-measure" in err
    _advise(tmp_path, "aligned", "--budget", "5", measure=True)
    assert "parameters on a CPU" not in capsys.readouterr().err
    monkeypatch.setattr(advise_run, "CPU_SLOW_PARAMS", 10**12)
    _advise(tmp_path, "aligned", measure=True)
    assert "parameters on a CPU" not in capsys.readouterr().err


def test_a_budget_not_above_zero_is_refused(tmp_path, bad_input):
    bad_input(["advise", "--json", str(tmp_path / "a.json"), "--no-measure", f"{PLANTED}:aligned", *CPU,
               "--budget", "0"], ["--budget", "> 0"])
