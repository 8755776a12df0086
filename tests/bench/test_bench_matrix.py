"""Running the matrix on CPU: results files, statuses with reasons, planted failures."""

from __future__ import annotations

import json

import pytest

from kiln.bench.compile.compile_bench import CompileBenchOptions, run_compile_bench
from kiln.bench.compile.recipes import Recipe, with_references
from kiln.cli.main import main
from kiln.config import load_config

CONTRACT = ("model", "mode", "precision", "backend", "scope", "compile_s", "step_ms", "speedup",
            "speedup_vs_eager_fp32", "peak_mem_bytes", "graph_breaks", "status", "reason")


def _run(overrides, recipes, **kw):
    opts = CompileBenchOptions(cfg=load_config(None, overrides), recipes=with_references(recipes), steps=3,
                               warmup=1, fresh_cache=False, **kw)
    rows = run_compile_bench(opts, log=lambda _: None)
    return {(r["precision"], r["loss"], r["mode"], r["backend"], r["scope"]): r for r in rows}


def test_tiny_matrix_writes_json_md_png_with_every_row_ok_or_reasoned(tmp_path, tiny_mlp, capsys):
    out = tmp_path / "bench"
    overrides = [o for o in tiny_mlp if "dropout" not in o] + ["model.kwargs.dropout=0.1"]
    code = main(["bench", "compile", "--modes", "default,reduce-overhead", "--backends", "inductor,aot_eager",
                 "--backends", "cudagraphs", "--steps", "3", "--warmup", "1", "--warm-cache", "--out", str(out),
                 *overrides])
    assert code == 0
    err = capsys.readouterr().err.splitlines()
    # Piped: a line when each phase starts (compiling is minutes on a GPU), then the row when done.
    compiling = err.index("kiln: [2/5] fp32 task inductor/default/model: compiling and warming up")
    timing = err.index("kiln: [2/5] fp32 task inductor/default/model: timing 3 samples interleaved with eager")
    done = next(i for i, line in enumerate(err) if line.startswith("[2/5] fp32 task inductor/default/model: ok"))
    assert err.index("kiln: [1/5] fp32 task eager: building eager") < compiling < timing < done
    assert "vs eager" in err[done] and "timed beside it" in err[done]
    payload = json.loads((out / "results.json").read_text())
    assert {"env", "config", "results", "command"} <= set(payload)
    assert payload["env"]["torch"] and payload["config"]["bench"]["steps"] == 3
    rows = payload["results"]
    assert [(r["mode"], r["backend"]) for r in rows] == [
        ("eager", None), ("default", "inductor"), ("reduce-overhead", "inductor"), ("default", "aot_eager"),
        ("default", "cudagraphs")]
    for row in rows:
        assert set(CONTRACT) <= set(row), row
        assert row["status"] in ("ok", "skipped"), row
        if row["status"] == "skipped":
            assert "CUDA" in row["reason"] and "cpu" in row["reason"]
        else:
            assert row["step_ms"] > 0 and row["speedup"] > 0 and row["throughput"] > 0
            assert abs(row["speedup"] - row["eager_step_ms"] / row["step_ms"]) < 1e-9
    eager, inductor, _, aot, _ = rows
    assert eager["uses_rng"] is True  # dropout 0.1: the compiled rows are checked on eager's RNG
    for row in (inductor, aot):
        assert row["accuracy"] == "pass" and row["compile_s"] >= 0 and row["graphs"] >= 1
        assert row["graph_breaks"] == 0 and row["recompiles"] == 0
    md = (out / "results.md").read_text()
    assert "| precision | loss | mode |" in md and "reduce-overhead" in md and "Command: `kiln bench compile" in md
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_planted_miscompilation_is_an_accuracy_failure(tiny_mlp, planted_backends):
    perturb, _, _ = planted_backends
    rows = _run(tiny_mlp, [Recipe("fp32", "default", perturb, "model"), Recipe("fp32", "default", "eager", "model")])
    bad = rows[("fp32", "task", "default", perturb, "model")]
    assert bad["status"] == "accuracy_fail" and bad["accuracy"] == "fail"
    assert "loss trajectory" in bad["reason"] and bad["step_ms"] > 0  # figures are kept
    assert rows[("fp32", "task", "default", "eager", "model")]["status"] == "ok"


def test_planted_miscompilation_fails_inference_outputs_too(tiny_mlp, planted_backends):
    perturb, _, _ = planted_backends
    rows = _run(tiny_mlp, [Recipe("fp32", "default", perturb, "model"), Recipe("fp32", "default", "eager", "model+loss")],
                train=False)
    assert rows[("fp32", "task", "default", perturb, "model")]["status"] == "accuracy_fail"
    assert "outputs" in rows[("fp32", "task", "default", perturb, "model")]["reason"]
    skipped = rows[("fp32", "task", "default", "eager", "model+loss")]
    assert skipped["status"] == "skipped" and "inference" in skipped["reason"]


def test_crash_and_oom_become_rows_and_the_matrix_continues(tiny_mlp, planted_backends):
    _, crash, oom = planted_backends
    rows = _run(tiny_mlp, [Recipe("fp32", "default", crash, "model"), Recipe("fp32", "default", oom, "model"),
                           Recipe("fp32", "default", "aot_eager", "model")], accuracy_steps=0)
    crashed = rows[("fp32", "task", "default", crash, "model")]
    assert crashed["status"] == "error" and "planted backend crash" in crashed["reason"]
    assert "\n" not in crashed["reason"]
    assert rows[("fp32", "task", "default", oom, "model")]["status"] == "oom"
    after = rows[("fp32", "task", "default", "aot_eager", "model")]
    assert after["status"] == "ok" and after["accuracy"] == "skipped"


@pytest.mark.parametrize("precision", ["bf16-mixed"])
def test_distill_scopes_and_the_fp32_reference(tiny_mlp, precision):
    recipes = [Recipe(precision, "default", "aot_eager", scope, "distill") for scope in ("model", "model/loss", "step")]
    rows = _run(tiny_mlp, recipes)
    assert len(rows) == 2 + 3  # eager fp32 (reference) + eager bf16 + three scopes
    for scope, graphs in (("model", 1), ("model/loss", 2)):
        row = rows[(precision, "distill", "default", "aot_eager", scope)]
        assert row["status"] == "ok" and row["accuracy"] == "pass", row
        assert row["graphs"] == graphs and row["speedup_vs_eager_fp32"] > 0
    step = rows[(precision, "distill", "default", "aot_eager", "step")]
    assert step["status"] == "ok" and step["accuracy"] == "pass", step


def test_plain_baseline_step_scope_and_warm_start_rows(tiny_mlp):
    from kiln.compile_cache import artifacts_supported

    # Warm inductor caches (fresh_cache=False), as the other matrix tests: no assertion here depends on
    # a cold first compile, which costs a C++ build of every kernel of three rows (most of the file's
    # time on CPU); the warm-start compile itself still starts from empty caches.
    plan = [Recipe("fp32", "default", "inductor", "step"), Recipe("fp32", "default", "inductor", "model"),
            Recipe("fp32", runner="plain"), Recipe("fp32", "default", "inductor", "model", runner="plain")]
    opts = CompileBenchOptions(cfg=load_config(None, tiny_mlp), recipes=with_references(plan), steps=3, warmup=1,
                               warm_start=True, fresh_cache=False)
    rows = {r["label"] if "label" in r else (r["runner"], r["mode"], r["scope"]): r
            for r in run_compile_bench(opts, log=lambda _: None)}
    step = rows[("kiln", "default", "step")]
    assert step["status"] == "ok" and step["accuracy"] == "pass"
    assert step["graph_breaks"] == 0 and step["recompiles"] == 0 and step["graphs"] == 2
    plain = rows[("plain", "default", "model")]
    assert plain["status"] == "ok" and plain["accuracy"] == "n/a (baseline)" and plain["graphs"] >= 1
    assert rows[("plain", "eager", None)]["status"] == "ok"
    # Kiln rows are put against the plain loop of the same mode (a ratio of speedups vs one eager runner).
    kiln_model = rows[("kiln", "default", "model")]
    assert kiln_model["speedup_vs_plain"] == pytest.approx(kiln_model["speedup"] / plain["speedup"])
    assert step["speedup_vs_best_plain"] == pytest.approx(
        step["speedup"] / max(plain["speedup"], rows[("plain", "eager", None)]["speedup"]))
    if artifacts_supported():
        for row in (step, kiln_model, plain):
            assert row["compile_warm_s"] is not None and row["compile_warm_s"] >= 0
            assert row["warm_cold_ratio"] == pytest.approx(row["compile_warm_s"] / row["compile_s"])
