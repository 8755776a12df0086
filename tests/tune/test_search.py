"""The autotune search's logic on a stand-in session with planted speeds: stage order, pruning,
the budget, the winner rule. (The real measuring is exercised in test_autotune_cli.py.)"""

from __future__ import annotations

import dataclasses
import signal
import time
import types
from pathlib import Path

import pytest
import torch

from kiln.bench.compile.recipes import Recipe
from kiln.config import load_config
from kiln.tune import space as sp
from kiln.tune.budget import Budget, BudgetExceeded, compile_factor
from kiln.tune.output import best_config, changed_keys, result_rows
from kiln.tune.search import Search, TuneOptions


class FakeSession:
    """Rows with planted speedups (vs eager fp32) and compile times; counts what was measured."""

    def __init__(self, speeds: dict[str, float], device: str = "cuda", compile_s: float = 1.0):
        self.speeds, self.compile_s = speeds, compile_s
        self.device = torch.device(device)
        self.measured: list[Recipe] = []
        self.opts = types.SimpleNamespace(steps=20)

    def __call__(self, bench_options, log):
        self.bench_options = bench_options
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def _row(self, recipe: Recipe) -> dict:
        speed = self.speeds.get(sp.describe(recipe), 0.5)
        ok = speed > 0
        return {"status": "ok" if ok else "error", "reason": None if ok else "planted failure",
                "speedup_vs_eager_fp32": speed if ok else None, "step_ms": 10.0 / speed if ok else None,
                "compile_s": self.compile_s * compile_factor(recipe) if ok else None,
                "accuracy": "pass" if recipe.compiled or recipe.cudagraphs else None}

    def has_eager(self, precision, loss="task"):
        return False

    def eager(self, precision, loss="task"):
        return self._row(Recipe.eager(precision)), types.SimpleNamespace(uses_rng=False)

    def measure(self, recipe: Recipe, retime: bool = False) -> dict:
        self.measured.append(recipe)
        return self._row(recipe)


BASE = load_config(None, ["training.device=cpu"])  # the device only decides the session's in real runs


def _search(speeds, *, precisions=("fp32",), modes=("default", "reduce-overhead"), budget_s=600.0, blocks=True,
            device="cuda", cfg=BASE, compile_s=1.0, **space):
    session = FakeSession(speeds, device, compile_s)
    opts = TuneOptions(cfg=cfg, space=sp.Space(list(precisions), list(modes), **space), budget_s=budget_s)
    return Search(opts, has_blocks=blocks, session_factory=session).run(), session


def test_stages_find_capture_plus_regional_and_confirm_it():
    speeds = {"fp32 eager": 1.0, "fp32 default/model": 1.2, "fp32 reduce-overhead/model": 2.5,
              "fp32 default/model +capture": 4.0, "fp32 default/model +regional +capture": 5.6,
              "fp32 default/model +regional": 0.8, "fp32 eager +capture": 3.0, "fp32 reduce-overhead/model +regional": 2.0}
    result, session = _search(speeds)
    assert sp.describe(result.winner) == "fp32 default/model +regional +capture"
    assert result.decided_on == "confirm"
    stages = [t.stage for t in result.trials]
    assert stages.index("modes") < stages.index("capture/regional") < stages.index("scope") < stages.index("confirm")
    # reduce-overhead records graphs itself: no capture variant of it is measured.
    assert Recipe("fp32", "reduce-overhead", "inductor", "model", cudagraphs=True) not in session.measured
    assert result.speedup_vs_default == pytest.approx(5.6)
    best = best_config(BASE, result)
    assert changed_keys(BASE, best) == {"compile.enabled": (False, True), "compile.regional": (False, True),
                                        "compile.cudagraphs": (False, True)}


def test_confirm_decides_on_the_finalists_own_medians():
    """Seen on an H100 (seed MLP): in the confirm stage the launch-bound eager fp32 reference read
    8.6 ms beside one finalist and 10.7 ms beside the other, so the ratios ranked the slower one
    (1.56 ms, 6.83x) above the faster (1.47 ms, 5.83x). The finalists' own medians decide."""
    speeds = {"fp32 eager": 1.0, "fp32 default/model": 1.2, "fp32 reduce-overhead/model": 2.5,
              "fp32 default/model +capture": 5.8, "fp32 default/model +regional +capture": 6.0,
              "fp32 default/model +regional": 0.8, "fp32 eager +capture": 3.0}
    confirm = {"fp32 default/model +capture": (1.47, 5.83), "fp32 default/model +regional +capture": (1.56, 6.83)}
    session = FakeSession(speeds)
    original = session.measure

    def measure(recipe, retime=False):
        row = original(recipe, retime)
        if retime and sp.describe(recipe) in confirm:
            row["step_ms"], row["speedup_vs_eager_fp32"] = confirm[sp.describe(recipe)]
        return row

    session.measure = measure
    opts = TuneOptions(cfg=BASE, space=sp.Space(["fp32"], ["default", "reduce-overhead"]), budget_s=600)
    result = Search(opts, has_blocks=True, session_factory=session).run()
    assert result.decided_on == "confirm"
    assert sp.describe(result.winner) == "fp32 default/model +capture"
    rows = {(r["stage"], r["candidate"]): r for r in result_rows(result)}
    winner = rows[("confirm", "fp32 default/model +capture")]
    assert winner["role"] == "winner"
    assert winner["speedup_vs_default"] == pytest.approx(rows[("confirm", "fp32 eager")]["step_ms"] / 1.47)


def test_rows_of_two_stages_compare_by_their_ratios_to_eager():
    """A confirm row ranks by its own median (steps/s), a search row by its ratio to eager fp32: the
    two are different units, so a row is compared with one of another stage by the ratios."""
    fast = {"status": "ok", "step_ms": 2.0, "speedup_vs_eager_fp32": 5.0}
    slow = {"status": "ok", "step_ms": 4.0, "speedup_vs_eager_fp32": 3.0}
    assert sp.relative(fast, "confirm", slow, "confirm") == pytest.approx(2.0)  # own medians
    assert sp.relative(fast, "modes", slow, "confirm") == pytest.approx(5.0 / 3.0)  # ratios
    assert sp.relative(fast, "confirm", slow, "baseline") == pytest.approx(5.0 / 3.0)
    assert sp.relative(fast, "confirm", {"status": "error"}, "confirm") is None


def test_clearly_slower_precision_and_mode_are_dropped():
    # bf16 is clearly slower in both kinds of mode (without CUDA graphs, and with them).
    speeds = {"fp32 eager": 1.0, "bf16-mixed eager": 1.1, "fp32 default/model": 1.2, "fp32 reduce-overhead/model": 3.0,
              "bf16-mixed default/model": 1.0, "bf16-mixed reduce-overhead/model": 2.0}
    result, session = _search(speeds, precisions=("fp32", "bf16-mixed"))
    later = [t.recipe for t in result.trials if t.stage not in ("baseline", "modes", "confirm")]
    assert later and all(r.precision == "fp32" for r in later)
    assert any(n.startswith("precision bf16-mixed dropped") for n in result.notes)
    assert sp.describe(result.winner).startswith("fp32 reduce-overhead")


def test_capture_on_cpu_is_not_tried_and_says_why():
    speeds = {"fp32 eager": 1.0, "fp32 default/model": 1.5, "fp32 default/step": 1.9}
    result, session = _search(speeds, modes=("default",), device="cpu")
    assert all(not sp.uses_cuda_graphs(r) for r in session.measured)
    assert any("CPU run" in n for n in result.notes)
    assert sp.describe(result.winner) == "fp32 default/step"


def test_budget_leaves_expensive_modes_untried():
    speeds = {"fp32 eager": 1.0, "fp32 default/model": 1.5}
    result, session = _search(speeds, modes=("default", "max-autotune-no-cudagraphs"), device="cpu",
                              compile_s=10.0, budget_s=100.0, regional=False, scopes=["model"])
    assert not any(r.mode == "max-autotune-no-cudagraphs" for r in session.measured)
    skipped = [n for n in result.not_tried if "max-autotune" in n["recipe"]]
    assert skipped and "budget left" in skipped[0]["reason"]
    rows = result_rows(result)
    assert any(r["status"] == "skipped" and r["reason"].startswith("not tried") for r in rows)


def test_a_winner_within_noise_keeps_the_config():
    cfg = load_config(None, ["compile.enabled=true"])
    speeds = {"fp32 eager": 1.0, "fp32 default/model": 1.50, "fp32 reduce-overhead/model": 1.51}
    result, _ = _search(speeds, cfg=cfg, regional=False, cudagraphs=False, scopes=["model"])
    assert result.winner == sp.config_recipe(cfg)
    assert changed_keys(cfg, best_config(cfg, result)) == {}


def test_failed_and_inaccurate_rows_never_win():
    speeds = {"fp32 eager": 1.0, "fp32 default/model": 0.0, "fp32 reduce-overhead/model": 9.0,
              "fp32 default/step": 1.4}
    session = FakeSession(speeds, "cpu")
    original = session._row

    def row(recipe):
        out = original(recipe)
        if recipe.mode == "reduce-overhead":
            out.update(status="accuracy_fail", accuracy="fail")
        return out

    session._row = row
    opts = TuneOptions(cfg=BASE, space=sp.Space(["fp32"], ["default", "reduce-overhead"]), budget_s=600)
    result = Search(opts, has_blocks=False, session_factory=session).run()
    assert result.winner.mode not in ("reduce-overhead",)
    assert sp.score(result.winner_trial.row) is not None


def test_hard_stop_interrupts_a_row_past_the_budget():
    budget = Budget(0.05)
    started = time.monotonic()
    with pytest.raises(BudgetExceeded), budget.hard_stop(grace_s=0.05):
        time.sleep(30)  # interrupted by the budget's alarm, not waited out
    assert time.monotonic() - started < 10


class OuterAlarm(Exception):
    pass


@pytest.fixture
def outer_alarm():
    """An alarm set by someone else (a test runner's timeout): its handler and its timer."""
    def ring(signum, frame):
        raise OuterAlarm

    previous = signal.signal(signal.SIGALRM, ring)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_hard_stop_sets_an_outer_alarm_again_afterwards(outer_alarm):
    signal.setitimer(signal.ITIMER_REAL, 60)
    with pytest.raises(BudgetExceeded), Budget(0.05).hard_stop(grace_s=0.05):
        time.sleep(30)
    left, _ = signal.getitimer(signal.ITIMER_REAL)
    assert 0 < left <= 60  # still armed, with what was left of it


def test_an_outer_alarm_due_first_still_fires(outer_alarm):
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    started = time.monotonic()
    with pytest.raises(OuterAlarm), Budget(600).hard_stop(grace_s=0):
        time.sleep(30)
    assert time.monotonic() - started < 10
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0  # fired once, not set again


def test_budget_estimates_scale_with_what_was_seen():
    budget = Budget(600.0, "cpu")
    default = Recipe("fp32", "default", "inductor", "model")
    budget.observe(default, {"status": "ok", "compile_s": 10.0}, wall_s=12.0)
    assert budget.compile_estimate(dataclasses.replace(default, regional=True)) == pytest.approx(3.0)
    assert budget.compile_estimate(dataclasses.replace(default, mode="max-autotune-no-cudagraphs")) == pytest.approx(150)
    assert budget.estimate(default, accuracy_recompile=True) == pytest.approx(22.0)


def test_a_precision_faster_in_one_kind_of_mode_survives():
    """bf16 loses under reduce-overhead but wins without graphs: capture may make it the winner."""
    speeds = {"fp32 eager": 1.0, "bf16-mixed eager": 1.3, "fp32 default/model": 1.2, "fp32 reduce-overhead/model": 3.0,
              "bf16-mixed default/model": 1.6, "bf16-mixed reduce-overhead/model": 2.0,
              "bf16-mixed default/model +capture": 4.5, "fp32 default/model +capture": 4.0}
    result, _ = _search(speeds, precisions=("fp32", "bf16-mixed"), regional=False)
    assert sp.describe(result.winner) == "bf16-mixed default/model +capture"


def test_only_allowed_precisions_are_candidates():
    """Eager fp32 is every row's reference; with bf16 alone allowed, nothing in fp32 is tried or wins."""
    cfg = load_config(None, ["precision.policy=bf16-mixed", "compile.enabled=true"])
    speeds = {"fp32 eager": 1.0, "bf16-mixed eager": 0.7, "bf16-mixed default/model": 0.8,
              "fp32 default/step": 3.0, "bf16-mixed default/step": 0.9}
    result, session = _search(speeds, cfg=cfg, precisions=("bf16-mixed",), modes=("default",), device="cpu")
    assert all(r.precision == "bf16-mixed" for r in session.measured if r != Recipe.eager("fp32"))
    assert result.winner.precision == "bf16-mixed"


def test_the_configs_own_compiled_recipe_counts_as_a_mode_row():
    """vit_b16.toml compiles with the default mode: that baseline row is the modes stage's row too,
    so its capture and regional variants are searched."""
    cfg = load_config(None, ["precision.policy=bf16-mixed", "compile.enabled=true"])
    speeds = {"fp32 eager": 1.0, "bf16-mixed eager": 1.8, "bf16-mixed default/model": 2.3,
              "bf16-mixed reduce-overhead/model": 2.5, "bf16-mixed default/model +capture": 2.6,
              "bf16-mixed default/model +regional +capture": 2.9}
    result, session = _search(speeds, cfg=cfg, precisions=("bf16-mixed",))
    assert session.measured.count(Recipe("bf16-mixed", "default", "inductor", "model")) == 2  # baseline, confirm
    assert sp.describe(result.winner) == "bf16-mixed default/model +regional +capture"
    assert all(t.recipe.precision == "bf16-mixed" for t in result.trials if t.stage == "confirm")


def test_strategy_stage_picks_the_faster_strategy(tmp_path, monkeypatch):
    """DDP vs FSDP runs go through `kiln train --nproc-per-node` (faked here: each writes the
    summary.json a run would); the faster one lands in best.toml, with capture off."""
    import json
    import subprocess

    from kiln.tune import strategy_stage as strategy

    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        run_dir = Path(cmd[cmd.index("--run-dir") + 1])
        cfg = load_config(cmd[cmd.index("--config") + 1])
        run_dir.mkdir(parents=True)
        rate = {"ddp": 900.0, "fsdp": 1200.0}[cfg.distributed.strategy]
        (run_dir / "summary.json").write_text(json.dumps({"step_ms_median": 64e3 / rate, "samples_per_s": rate}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(strategy.subprocess, "run", fake_run)
    speeds = {"fp32 eager": 1.0, "fp32 default/model": 1.5, "fp32 default/model +capture": 3.0}
    result, _ = _search(speeds, modes=("default",), regional=False, scopes=["model"])
    assert result.winner.cudagraphs
    strategy.strategy_stage(result, TuneOptions(cfg=BASE, space=sp.Space(["fp32"], ["default"]), budget_s=600),
                            2, tmp_path, log=lambda m: None)
    assert [c[c.index("--nproc-per-node") + 1] for c in calls] == ["2", "2"]
    assert result.extra["strategy"] == "fsdp"
    best = best_config(BASE, result)
    assert best.distributed.strategy == "fsdp" and not best.compile.cudagraphs and best.compile.enabled
    rows = [r for r in result_rows(result) if r.get("stage") == "strategy"]
    assert [r["strategy"] for r in rows] == ["ddp", "fsdp"] and rows[1]["role"] == "winner (strategy)"


class NoisySession(FakeSession):
    """FakeSession whose rows named in `noisy` carry the noise flag kiln.bench.ratios sets."""

    def __init__(self, speeds, noisy=(), **kw):
        super().__init__(speeds, **kw)
        self.noisy = set(noisy)

    def _row(self, recipe):
        row = super()._row(recipe)
        if sp.describe(recipe) in self.noisy:
            row.update(noisy=True, flags="noisy step: planted")
        return row


def _decide(speeds, noisy=(), rank_noisy=False):
    session = NoisySession(speeds, noisy, device="cpu")
    opts = TuneOptions(cfg=BASE, space=sp.Space(["fp32"], ["default"], cudagraphs=False, regional=False,
                                                scopes=["model"]), budget_s=600.0, rank_noisy=rank_noisy)
    return Search(opts, has_blocks=False, session_factory=session).run()


@pytest.mark.parametrize(("speed", "wins"), [(1.019, False), (1.0201, True)])
def test_the_two_percent_rule_is_applied_to_the_figure_the_table_shows(speed, wins):
    result = _decide({"fp32 eager": 1.0, "fp32 default/model": speed})
    assert (result.winner.mode == "default") is wins
    winner_row = next(r for r in result_rows(result) if r["role"] == "winner")
    # The header's figure is the winner's row's `vs config`, exactly.
    assert result.speedup_vs_default == winner_row["speedup_vs_default"]
    if wins:
        assert winner_row["speedup_vs_default"] == pytest.approx(speed)
    else:
        assert any("2% faster" in n and "1.019x" in n for n in result.notes)


def test_a_noisy_row_does_not_win_unless_noisy_rows_may_rank():
    speeds = {"fp32 eager": 1.0, "fp32 default/model": 1.5}
    kept = _decide(speeds, noisy={"fp32 default/model"})
    assert not kept.winner.compiled
    assert any("too noisy to rank" in n and "--rank-noisy" in n for n in kept.notes)
    ranked = _decide(speeds, noisy={"fp32 default/model"}, rank_noisy=True)
    assert ranked.winner.mode == "default" and ranked.speedup_vs_default == pytest.approx(1.5)


def test_confirm_rows_far_from_their_search_rows_are_flagged_round_to_round():
    class Drifting(NoisySession):
        def measure(self, recipe, retime=False):
            row = super().measure(recipe, retime)
            if retime and row.get("step_ms"):
                row["step_ms"] *= 1.5  # the machine got busier between the rounds
            return row

    session = Drifting({"fp32 eager": 1.0, "fp32 default/model": 1.5}, device="cpu")
    opts = TuneOptions(cfg=BASE, space=sp.Space(["fp32"], ["default"], cudagraphs=False, regional=False,
                                                scopes=["model"]), budget_s=600.0)
    result = Search(opts, has_blocks=False, session_factory=session).run()
    confirm = [t for t in result.trials if t.stage == "confirm"]
    assert confirm and all(t.row["noisy"] and "round to round" in t.row["flags"] and "50% apart" in t.row["flags"]
                           for t in confirm)
    assert not result.winner.compiled  # noisy rows keep the config's own recipe


@pytest.mark.parametrize("width", [90, 200])
def test_the_table_shows_noisy_ratios_as_uncertain_with_their_flags(width):
    import io

    from rich.console import Console

    from kiln.tune.output import render_table

    result = _decide({"fp32 eager": 1.0, "fp32 default/model": 1.5}, noisy={"fp32 default/model"})
    console = Console(width=width, file=io.StringIO(), record=True)
    console.print(render_table(result, "kiln autotune: test"))
    flat = " ".join(console.export_text().replace("│", " ").split())
    assert "~1.5x?" in flat and "noisy step: planted" in flat and "1.50x" not in flat


def test_a_slow_eager_baseline_is_stopped_at_the_budget_not_after_it():
    """The eager reference is measured inside the budget's hard stop too: a 10-minute budget on a
    CPU where one eager row takes 25 minutes stops at 10, with the rows and reasons kept."""
    class SlowEager(FakeSession):
        def eager(self, precision, loss="task"):
            time.sleep(30)  # cut short by the budget's alarm
            return super().eager(precision, loss)

    session = SlowEager({"fp32 eager": 1.0}, "cpu")
    opts = TuneOptions(cfg=BASE, space=sp.Space(["fp32"], ["default"]), budget_s=1.0)
    started = time.monotonic()
    result = Search(opts, has_blocks=False, session_factory=session).run()
    assert time.monotonic() - started < 10
    assert result.stop_reason == "time budget spent" and session.measured == []
    (first,) = [t for t in result.trials]
    assert first.row["status"] == "skipped" and "budget" in first.row["reason"]
    assert result.not_tried and all("the search stopped: time budget spent" in n["reason"] for n in result.not_tried)


def test_ctrl_c_stops_the_search_and_keeps_what_was_measured():
    speeds = {"fp32 eager": 1.0, "fp32 default/model": 1.5, "fp32 reduce-overhead/model": 2.0}
    session = FakeSession(speeds, "cpu")
    measure = session.measure

    def interrupted_third(recipe, retime=False):
        if len(session.measured) == 2:
            raise KeyboardInterrupt
        return measure(recipe, retime)

    session.measure = interrupted_third
    opts = TuneOptions(cfg=BASE, space=sp.Space(["fp32"], ["default", "reduce-overhead"]), budget_s=600)
    result = Search(opts, has_blocks=True, session_factory=session).run()
    assert result.stop_reason == "interrupted (Ctrl-C)"
    ok = [t for t in result.trials if t.row["status"] == "ok"]
    assert len(ok) == 2 and any(t.row["reason"] == "interrupted (Ctrl-C) during this row" for t in result.trials)
    assert any("the search stopped: interrupted (Ctrl-C)" in n["reason"] for n in result.not_tried)
    assert len(session.measured) == 2  # nothing measured after the interruption
    assert any("rows measured before it are kept" in n for n in result.notes)


def test_piped_progress_says_when_each_row_starts(capsys):
    from kiln.tune.progress import RichProgress

    with RichProgress(600) as progress:  # stderr is not a terminal here, as when piped
        progress.planned(3)
        progress.started("baseline", "fp32 eager")
    err = capsys.readouterr().err
    assert "[baseline] fp32 eager: measuring (row 1 of 3" in err
