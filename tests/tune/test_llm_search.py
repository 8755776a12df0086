"""`kiln autotune` for an LLM: the candidates of each knob, the stage logic (keep only what is
faster, climb batch sizes until one does not fit, retry an out-of-memory batch with selective
checkpointing, reject a float8 candidate whose loss drifts), the budget, and best.toml."""

from __future__ import annotations

import pytest

from kiln.config import load_config
from kiln.tune import llm_space as sp
from kiln.tune.llm_output import best_config, result_rows, write_best
from kiln.tune.llm_search import LlmSearch, LlmTuneOptions

BASE = ["model.name=llama:llama-3.2-1b", "data.batch_size=4", "data.seq_len=128", "training.device=cpu",
        "compile.enabled=true", "compile.regional=true"]


def test_candidate_overrides_are_config_keys_kiln_train_loads():
    c = sp.LlmCandidate(batch=8, ac="selective", ce="liger", float8="rowwise", compile="model+loss")
    cfg = load_config(None, ["model.name=llama:llama-3.2-1b", *c.overrides()])
    assert cfg.data.batch_size == 8 and cfg.training.activation_checkpointing == "selective"
    assert cfg.training.ce_kernel == "liger" and cfg.precision.float8 == "rowwise"
    assert cfg.compile.enabled and cfg.compile.scope == "model+loss" and not cfg.compile.regional
    assert sp.from_config(cfg) == c and cfg.precision.policy == "fp32"  # the default config's, not searched
    master = c.with_(precision="bf16-master")
    assert sp.from_config(load_config(None, ["model.name=llama:llama-3.2-1b", *master.overrides()])) == master
    assert sp.from_config(load_config(None, BASE)) == sp.LlmCandidate(4, "none", "chunked", "none", "regional")
    off = sp.LlmCandidate(2, "none", "plain", "none", "off")
    assert sp.from_config(load_config(None, ["model.name=llama:llama-3.2-1b", *off.overrides()])) == off


def test_stage_candidates_move_one_knob():
    best = sp.LlmCandidate(4, "none", "chunked", "none", "regional")
    space = sp.LlmSpace(batches=[1, 2, 4, 8, 16])
    assert [c.batch for c in sp.stage_candidates("batch", best, space)] == [8, 16, 2, 1]
    assert [c.ac for c in sp.stage_candidates("ac", best, space)] == ["selective", "full"]
    assert [c.compile for c in sp.stage_candidates("compile", best, space)] == ["whole"]
    assert all(c.with_(float8="none") == best for c in sp.stage_candidates("float8", best, space))
    assert sp.stage_candidates("precision", best, space) == []  # only the config's policy by default
    space.precision = ["bf16-mixed", "bf16-master"]
    mixed = best.with_(precision="bf16-mixed")
    assert sp.stage_candidates("precision", mixed, space) == [mixed.with_(precision="bf16-master")]
    assert sp.default_batches(4) == [2, 4, 8, 16] and sp.default_batches(1) == [1, 2, 4]


class FakeGpu:
    """Tokens/s from a table of effects; out of memory above a batch limit that depends on AC."""

    def __init__(self, fp8_loss=3.0, limit=None, master_loss=3.0):
        self.calls = []
        self.fp8_loss, self.master_loss = fp8_loss, master_loss
        self.limit = limit or {"none": 8, "selective": 16, "full": 32}

    def __call__(self, c: sp.LlmCandidate) -> dict:
        self.calls.append(c)
        if c.batch > self.limit[c.ac]:
            return {"status": "oom", "reason": "CUDA out of memory"}
        speed = 1000.0 * min(c.batch, 16) ** 0.5
        speed *= {"none": 1.0, "selective": 0.9, "full": 0.7}[c.ac]
        speed *= {"chunked": 1.1, "plain": 1.0, "liger": 1.15}[c.ce]
        speed *= {"none": 1.0, "tensorwise": 1.3, "rowwise": 1.2}[c.float8]
        speed *= {"regional": 1.0, "whole": 1.01, "model+loss": 0.95, "off": 0.5}[c.compile]
        speed *= {None: 1.0, "bf16-mixed": 1.0, "bf16-master": 1.1, "bf16-true": 1.12}[c.precision]
        loss = self.fp8_loss if c.float8 == "tensorwise" else self.master_loss if c.precision == "bf16-master" else 3.0
        return {"status": "ok", "tokens_per_s": speed, "step_ms": 1.0, "loss_last": loss, "peak_mem_bytes": 1 << 30}


def _opts(space, budget=600.0, overrides=()):
    return LlmTuneOptions(cfg=load_config(None, [*BASE, *overrides]), space=space, budget_s=budget)


def test_search_keeps_each_faster_knob_and_climbs_batches_with_selective_after_oom():
    fake = FakeGpu()
    space = sp.LlmSpace(batches=[2, 4, 8, 16, 32], float8=["none", "tensorwise", "rowwise"],
                        ce=["chunked", "liger", "plain"], compile=["regional", "whole", "model+loss"])
    result = LlmSearch(_opts(space), measure=fake, device_type="cuda").run()
    # ce: liger is 4.5 % faster; ac: none stays; batch 16 runs out of memory without AC and runs
    # with selective (sqrt(16)*0.9 > sqrt(8)), 32 does not fit; float8 tensorwise (1.3x) passes.
    assert result.winner == sp.LlmCandidate(16, "selective", "liger", "tensorwise", "regional")
    assert sp.LlmCandidate(16, "none", "liger", "none", "regional") in fake.calls  # the OOM, then selective
    assert sp.LlmCandidate(32, "selective", "liger", "none", "regional") in fake.calls
    # whole is only 1 % faster: within the noise margin, the config's regional compile stays.
    assert result.winner.compile == "regional"
    assert result.speedup_vs_default == pytest.approx(4 ** 0.5 * 0.9 * 1.15 / 1.1 * 1.3)
    rows = result_rows(result)
    assert [r["role"] for r in rows].count("winner") == 1 and rows[0]["role"] == "default"
    assert any(r["status"] == "oom" for r in rows)
    assert next(r for r in rows if r["float8"] == "tensorwise")["accuracy"] == "pass"


def test_float8_whose_loss_drifts_is_not_the_winner():
    fake = FakeGpu(fp8_loss=3.5)
    space = sp.LlmSpace(batches=[4], ac=["none"], ce=["chunked"], float8=["none", "tensorwise", "rowwise"],
                        compile=["regional"])
    result = LlmSearch(_opts(space), measure=fake, device_type="cuda").run()
    assert result.winner.float8 == "rowwise"  # tensorwise is faster but its loss is 17 % off
    assert any("outside 2%" in n for n in result.notes)


@pytest.mark.parametrize(("master_loss", "winner"), [(3.03, "bf16-master"), (3.3, "bf16-mixed")])
def test_precision_policy_is_kept_only_if_its_loss_stays(master_loss, winner):
    fake = FakeGpu(master_loss=master_loss)
    space = sp.LlmSpace(batches=[4], ac=["none"], ce=["chunked"], float8=["none"], compile=["regional"],
                        precision=["bf16-mixed", "bf16-master"])
    result = LlmSearch(_opts(space, overrides=["precision.policy=bf16-mixed"]), measure=fake, device_type="cuda").run()
    assert result.winner.precision == winner  # 10 % faster; a 1 % loss change passes, 10 % does not
    assert sp.LlmCandidate(4, "none", "chunked", "none", "regional", "bf16-master") in fake.calls
    trial = next(t for t in result.trials if t.candidate.precision == "bf16-master")
    assert trial.stage == "precision" and trial.row["accuracy"] == ("pass" if winner == "bf16-master" else "fail")
    assert any("with bf16-mixed: outside 2%" in n for n in result.notes) == (winner == "bf16-mixed")


def test_budget_leaves_what_does_not_fit_as_not_tried():
    def slow(c):
        import time

        time.sleep(0.05)
        return FakeGpu()(c)

    space = sp.LlmSpace(batches=[4, 8], ac=["none", "selective"], ce=["chunked"], float8=["none"],
                        compile=["regional"])
    search = LlmSearch(_opts(space, budget=0.08), measure=slow, device_type="cuda")
    result = search.run()
    assert len(result.trials) >= 1 and result.not_tried
    assert all("budget" in n["reason"] for n in result.not_tried)
    assert result.winner == result.default


def test_best_toml_holds_the_winning_keys(tmp_path):
    space = sp.LlmSpace(batches=[4, 8], ac=["none"], ce=["chunked", "plain"], float8=["none"], compile=["regional"])
    opts = _opts(space)
    result = LlmSearch(opts, measure=FakeGpu(), device_type="cuda").run()
    path = write_best(tmp_path, opts.cfg, result, model="llama:llama-3.2-1b", device="H100")
    best = load_config(path)
    assert best.data.batch_size == 8 and best.training.ce_kernel == "chunked"
    assert best.model == opts.cfg.model and best.optim == opts.cfg.optim
    assert best_config(opts.cfg, result).data.batch_size == 8
    assert "winner: b8" in path.read_text().splitlines()[1]


def test_precision_and_compile_are_searched_before_the_small_knobs():
    """The large levers first: a budget that runs out leaves ce/ac/batch untried, not compile (an
    LLM autotune on a CPU spent its budget on them and picked 1.06x where compile + bf16 gave 1.5x)."""
    fake = FakeGpu()
    space = sp.LlmSpace(batches=[4, 8], ac=["none", "selective"], ce=["chunked", "plain"], float8=["none"],
                        compile=["off", "regional"], precision=["bf16-mixed"])
    result = LlmSearch(_opts(space, overrides=["compile.enabled=false"]), measure=fake, device_type="cpu").run()
    stages = list(dict.fromkeys(t.stage for t in result.trials))
    assert stages[:3] == ["baseline", "precision", "compile"]
    assert result.winner.compile == "regional"  # compile wins (bf16-mixed: no faster in this fake)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_is_searched_on_a_cpu_that_runs_it_natively(monkeypatch, native):
    """`kiln env` and `kiln advise` say bf16 pays on a CPU with AMX / AVX512-BF16: autotune searches it
    there (both searches), and says why not on a CPU that would emulate it."""
    import kiln.precision
    from kiln.cli.main import build_parser, parse_args
    from kiln.config.options import from_namespace
    from kiln.tune import autotune_check as plan
    from kiln.tune.autotune_request import AutotuneRequest

    monkeypatch.setattr(kiln.precision, "cpu_bf16_native", lambda: native)
    monkeypatch.setattr(plan, "cpu_bf16_native", lambda: native)
    monkeypatch.setattr(kiln.precision, "_warn_emulated_bf16", lambda: None)
    args = parse_args(build_parser(), ["autotune", "training.device=cpu"])
    opts, _, _ = plan.plan_autotune(from_namespace(AutotuneRequest, args))
    assert ("bf16-mixed" in opts.space.precisions) is native
    cfg = load_config(None, BASE)
    searched, why = plan.precisions_here(cfg, __import__("torch").device("cpu"))
    assert searched == (["bf16-mixed"] if native else [])
    assert (why is None) if native else "no native bf16" in why
