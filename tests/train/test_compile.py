"""torch.compile on CPU (inductor's C++ backend) for a tiny MLP, in every scope."""

from __future__ import annotations

import json

import pytest
import torch

from kiln.compile import compile_kwargs
from kiln.config import load_config
from kiln.config.schema import CompileConfig
from kiln.train.trainer import train


def test_compile_kwargs_mode_and_options():
    kw = compile_kwargs(CompileConfig(enabled=True, mode="max-autotune", dynamic=False))
    assert kw == {"backend": "inductor", "fullgraph": False, "mode": "max-autotune", "dynamic": False}
    kw = compile_kwargs(CompileConfig(enabled=True, options={"coordinate_descent_tuning": True}))
    assert "mode" not in kw and kw["options"] == {"coordinate_descent_tuning": True} and kw["dynamic"] is None


def _losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _run(tmp_path, name, overrides):
    cfg = load_config(None, [*overrides, "training.deterministic=true"])
    return train(cfg, tmp_path / name)


@pytest.mark.parametrize(
    "extra",
    [
        ["compile.scope=model"],
        ["compile.scope=model+loss"],
        ["compile.scope=step"],
        ["compile.scope=model", "compile.regional=true"],
    ],
    ids=["model", "model+loss", "step", "regional"],
)
def test_compiled_matches_eager(tmp_path, tiny_overrides, extra):
    torch._dynamo.reset()
    _run(tmp_path, "eager", tiny_overrides)
    compiled = _run(tmp_path, "compiled", [*tiny_overrides, "compile.enabled=true", *extra])
    assert compiled["status"] == "completed"
    assert compiled["compile"]["enabled"] is True
    assert compiled["compile"]["graphs"] >= 1
    # Same seed, same data: every logged loss agrees to float32 re-association error.
    eager_losses = _losses(tmp_path / "eager")
    compiled_losses = _losses(tmp_path / "compiled")
    assert len(eager_losses) == len(compiled_losses) == 7
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-3, abs=1e-4)
    assert compiled["final_loss"] < compiled["first_loss"]


@pytest.mark.parametrize("policy", ["error", "skip"])
def test_step_scope_has_no_graph_breaks_or_recompiles(tmp_path, tiny_overrides, policy):
    # Log steps ask for the gradient norm and the LR changes every step: neither may recompile;
    # the optimizer is traced (not a fused kernel behind a break), zero_grad stays outside.
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps the graph counters of earlier tests
    summary = _run(tmp_path, "step", [*tiny_overrides, "compile.enabled=true", "compile.scope=step",
                                      "optim.warmup_steps=3", f"training.nonfinite={policy}"])
    counters = summary["compile"]
    assert counters["graph_breaks"] == 0 and counters["recompiles"] == 0
    # forward+loss, and the update (norm, clip, optimizer) or, under `skip`, the norm and flag.
    assert counters["graphs"] == 2


def test_compile_aot_eager_backend(tmp_path, tiny_overrides, capsys):
    torch._dynamo.reset()
    console_on = [o for o in tiny_overrides if o != "metrics.console=false"] + ["metrics.console=true"]
    summary = _run(tmp_path, "aot", [*console_on, "compile.enabled=true", "compile.backend=aot_eager"])
    assert summary["status"] == "completed"
    assert summary["compile"]["graphs"] >= 1
    # Piped, the console says the first step is compiling before its record arrives.
    lines = capsys.readouterr().out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("step 1/30 |") or line.startswith("step 1/30 "))
    assert lines.index("step 1/30: compiling the training step (torch.compile, mode default, scope model); the "
                       "first record follows when it is done") < first


def test_recompiles_count_compilations_beyond_the_first():
    from kiln.compile import compile_counters, recompiles

    torch._dynamo.reset()
    double = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    for n in (3, 4, 5):  # static shapes: each new shape recompiles
        double(torch.ones(n))
    assert recompiles() == 2
    assert compile_counters()["recompiles"] == 2
    torch._dynamo.reset()
    assert recompiles() == 0


def test_compile_cache_is_saved_with_the_run_and_loaded_on_resume(tmp_path, tiny_overrides, caplog, monkeypatch):
    import logging

    from kiln.compile_cache import ARTIFACTS_FILE, artifacts_supported

    if not artifacts_supported():
        pytest.skip(f"torch {torch.__version__} has no torch.compiler.save_cache_artifacts")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    torch._dynamo.reset()
    over = [*tiny_overrides, "compile.enabled=true", "checkpoint.interval=10", "training.steps=20"]
    run_dir = tmp_path / "run"
    _run(tmp_path, "run", over)
    assert (run_dir / ARTIFACTS_FILE).stat().st_size > 0
    assert any((tmp_path / "cache").iterdir())  # inductor's cache lived in kiln's dir
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="kiln"):
        summary = _run(tmp_path, "run", [*over, f"checkpoint.resume={run_dir}/checkpoints/step_00000010"])
    assert summary["status"] == "completed" and summary["resumed_from"].endswith("step_00000010")
    assert any("compile cache artifacts from" in r.getMessage() for r in caplog.records)


def test_compile_cache_dir_context(tmp_path, monkeypatch):
    import os

    from kiln.compile_cache import compile_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "k"))
    with compile_cache_dir("") as used:
        assert used == tmp_path / "k" and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str((tmp_path / "k").resolve())
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    with compile_cache_dir(str(tmp_path / "mine")) as used:
        assert used == tmp_path / "mine"
    with compile_cache_dir("torch") as used:
        assert used is None and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users"))
    with compile_cache_dir("") as used:  # the user's own setting wins
        assert used == tmp_path / "users"


def test_a_cuda_graph_mode_off_cuda_is_said_not_silent():
    """compile.mode=reduce-overhead on a CPU: kiln train says it compiles without CUDA graphs (kiln
    bench compile skips the recipe there), instead of running it silently as if it applied."""
    from kiln.compile import cuda_graph_mode_note
    from kiln.config import load_config

    def note(*over, device="cpu"):
        return cuda_graph_mode_note(load_config(None, ["compile.enabled=true", *over]).compile, device)

    assert "compile.mode=reduce-overhead records CUDA graphs" in note("compile.mode=reduce-overhead")
    assert note("compile.mode=max-autotune") is not None
    assert note("compile.mode=reduce-overhead", device="cuda") is None
    assert note("compile.mode=default") is None and note("compile.mode=max-autotune-no-cudagraphs") is None
