"""benchmarks/settings_sweep.py: cases checked before any run, runs interleaved round by round with
their own --out, the time budget, and the table's medians, spreads, changes and verdicts (exact)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..benchmark_scripts import load_script

sweep = load_script("settings_sweep")
KILN = ["bench", "llm", "--model", "tiny"]


class FakeRuns:
    """Stands for with_settings.py's processes: records each argv and writes the results.json its
    case and round are given (decode_step_ms per batch), taking `seconds` on a fake clock."""

    def __init__(self, values: dict[str, dict[int, list[float]]], seconds: float = 10.0, status: str = "ok"):
        self.values, self.seconds, self.status, self.calls, self.now = values, seconds, status, [], 0.0

    def clock(self) -> float:
        return self.now

    def launch(self, argv: list[str], timeout_s: float) -> str:
        self.calls.append((argv, timeout_s))
        out = Path(argv[argv.index("--out") + 1])
        case, rnd = out.name.rsplit("_", 1)
        rows = [{"engine": "kiln-compiled", "quant": "int4@triton", "batch": batch, "status": "ok",
                 "decode_step_ms": per_round[int(rnd) - 1]} for batch, per_round in self.values[case].items()]
        out.mkdir(parents=True)
        (out / "results.json").write_text(json.dumps({"results": rows}))
        self.now += self.seconds
        return self.status


def cases(*texts: str) -> list[str]:
    return [arg for text in texts for arg in ("--case", text)]


def test_cases_parse_and_bad_ones_say_why():
    case = sweep.parse_case("x:kiln.kernels.triton_rows.SWAP_X_ONCE=True kiln.kernels.triton_rows.DECODE_WARPS=8")
    assert case == sweep.Case("x", ("kiln.kernels.triton_rows.SWAP_X_ONCE=True", "kiln.kernels.triton_rows.DECODE_WARPS=8"))
    assert sweep.parse_case("off:") == sweep.Case("off", ())
    for bad, says in [("off", "NAME:SETTING"), ("Off:", "NAME:SETTING"), ("x:kiln.a.B=nope", "not a Python literal"),
                      ("x:SWAP=1", "MODULE.NAME=VALUE")]:
        with pytest.raises(ValueError, match=says):
            sweep.parse_case(bad)


@pytest.mark.parametrize("args,says", [
    (cases("off:", "x:kiln.kernels.triton_rows.NO_SUCH=1"), "has no 'NO_SUCH'"),
    (cases("off:", "x:kiln.no_such_module.A=1"), "cannot be imported"),
    (cases("off:", "off:kiln.kernels.triton_rows.DECODE_WARPS=8"), "names repeat"),
    (cases("off:") + ["--rounds", "0"], "--rounds 0"),
])
def test_bad_input_exits_2_before_any_run(tmp_path, capsys, args, says):
    fake = FakeRuns({})
    assert sweep.main(["--out", str(tmp_path), *args, "--", *KILN], fake.launch, fake.clock) == 2
    assert says in capsys.readouterr().err
    assert fake.calls == [] and not (tmp_path / "results.json").exists()


def test_an_out_among_the_kiln_arguments_is_refused(tmp_path, capsys):
    fake = FakeRuns({})
    assert sweep.main(["--out", str(tmp_path), *cases("off:"), "--", *KILN, "--out", "x"], fake.launch, fake.clock) == 2
    assert "--out among the kiln arguments" in capsys.readouterr().err
    assert sweep.main(["--out", str(tmp_path), *cases("off:")], fake.launch, fake.clock) == 2
    assert "no kiln command" in capsys.readouterr().err


def test_runs_interleave_and_the_table_compares_with_the_first_case(tmp_path):
    x = "kiln.kernels.triton_rows.SWAP_X_ONCE=True"
    fake = FakeRuns({"off": {16: [2.0, 2.2], 32: [3.0, 3.0]},
                     "x": {16: [1.5, 1.6], 32: [3.1, 2.9]},
                     "w": {16: [2.5, 2.5], 32: [3.0, 3.0]}})
    argv = ["--out", str(tmp_path), *cases("off:", f"x:{x}", "w:kiln.kernels.triton_rows.DECODE_WARPS=8"),
            "--budget-s", "100", "--min-left-s", "5", "--", *KILN]
    assert sweep.main(argv, fake.launch, fake.clock) == 0
    outs = [Path(a[a.index("--out") + 1]).name for a, _ in fake.calls]
    assert outs == ["off_1", "x_1", "w_1", "off_2", "x_2", "w_2"]
    assert fake.calls[1][0] == [x, "--", *KILN, "--out", str(tmp_path / "runs" / "x_1")]
    assert [t for _, t in fake.calls] == [100, 90, 80, 70, 60, 50]  # each run stops at the budget
    rows = {(r["case"], r["batch"]): r for r in json.loads((tmp_path / "results.json").read_text())["results"]}
    off16, x16, x32, w16 = rows["off", 16], rows["x", 16], rows["x", 32], rows["w", 16]
    assert off16["median"] == pytest.approx(2.1) and off16["verdict"] == "reference" and off16["change_pct"] == 0
    assert off16["spread_pct"] == pytest.approx(100 * 0.2 / 2.1)
    assert x16["median"] == pytest.approx(1.55) and x16["change_pct"] == pytest.approx(100 * (1.55 / 2.1 - 1))
    assert x16["verdict"] == "better"
    assert x32["change_pct"] == pytest.approx(0.0) and x32["verdict"] == "within spread"
    assert w16["verdict"] == "worse" and w16["spread_pct"] == 0
    assert x16["settings"] == x and off16["settings"] == "(defaults)"
    md = (tmp_path / "results.md").read_text()
    assert "| 2 | w | ok | 10 |  |" in md and "against case off" in md


def test_the_budget_skips_runs_and_a_failed_run_exits_1(tmp_path):
    fake = FakeRuns({"off": {16: [2.0, 2.0]}, "x": {16: [1.0, 1.0]}}, seconds=40.0)
    argv = ["--out", str(tmp_path), *cases("off:", "x:kiln.kernels.triton_rows.DECODE_WARPS=8"), "--budget-s", "100",
            "--min-left-s", "30", "--", *KILN]
    assert sweep.main(argv, fake.launch, fake.clock) == 1  # a skipped run is not a finished sweep
    payload = json.loads((tmp_path / "results.json").read_text())
    assert [(r["dir"], r["status"]) for r in payload["config"]["runs"]] == [
        ("off_1", "ok"), ("x_1", "ok"), ("off_2", "skipped"), ("x_2", "skipped")]
    x16 = next(r for r in payload["results"] if r["case"] == "x")
    assert x16["verdict"] == "one sample" and x16["change_pct"] == pytest.approx(-50.0)
    failing = FakeRuns({"off": {16: [2.0, 2.0]}}, status="failed")
    assert sweep.main(["--out", str(tmp_path / "f"), *cases("off:"), "--", *KILN], failing.launch, failing.clock) == 1


def test_ctrl_c_keeps_the_finished_runs_and_exits_130(tmp_path):
    class Interrupting(FakeRuns):
        def launch(self, argv, timeout_s):
            if len(self.calls) == 2:
                self.calls.append((argv, timeout_s))
                raise KeyboardInterrupt
            return super().launch(argv, timeout_s)

    fake = Interrupting({"off": {16: [2.0, 2.0]}, "x": {16: [1.0, 1.0]}})
    argv = ["--out", str(tmp_path), *cases("off:", "x:kiln.kernels.triton_rows.DECODE_WARPS=8"), "--", *KILN]
    assert sweep.main(argv, fake.launch, fake.clock) == 130
    payload = json.loads((tmp_path / "results.json").read_text())
    assert [r["status"] for r in payload["config"]["runs"]] == ["ok", "ok", "interrupted", "skipped"]
    assert len(fake.calls) == 3 and {r["case"] for r in payload["results"]} == {"off", "x"}
