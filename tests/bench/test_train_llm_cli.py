"""`kiln bench train-llm` on a CPU with a tiny Llama: bad input exits 2 before any work; a run
trains every row from the same weights on the same tokens and writes results.json/md."""

from __future__ import annotations

import json

import pytest

from kiln.cli.main import main
from kiln.models.hf import PRESETS


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({**PRESETS["llama-tiny"], "head_dim": 16}))
    return str(path)


@pytest.mark.parametrize(("args", "needles"), [
    (["--seq-len", "300"], ["--seq-len", "256 positions"]),
    (["--rows", "plain,titan"], ["--rows", "'titan'", "torchtitan"]),
    (["--recipe", "fast compile.enabled=true"], ["--recipe", "NAME: KEY=VALUE"]),
    (["--recipe", "fast: compile.enabeld=true"], ["--recipe", "compile.enabeld"]),
    (["--recipe", "plain: compile.enabled=true"], ["--recipe", "peer row"]),
    (["--peer-recipe", "nt: plain ac=none"], ["--peer-recipe", "plain takes no settings", "torchtitan"]),
    (["--peer-recipe", "nt: titan a.b=c"], ["--peer-recipe", "unknown peer 'titan'", "torchtitan"]),
    (["--peer-recipe", "nt: torchtitan"], ["--peer-recipe", "no settings", "SECTION.KEY=VALUE"]),
    (["--peer-recipe", "nt: torchtitan steps"], ["--peer-recipe", "'steps' is not KEY=VALUE"]),
    (["--peer-recipe", "nt: torchtitan steps=3"], ["--peer-recipe", "SECTION.KEY=VALUE", "'steps=3'"]),
    (["--peer-recipe", "plain: torchtitan a.b=c"], ["--peer-recipe", "'plain' names another row"]),
    (["--peer-recipe", "torchtitan a.b=c"], ["--peer-recipe", "NAME: PEER KEY=VALUE"]),
    (["--steps", "3", "--warmup", "2"], ["--steps", ">= 4"]),
    (["--lr-warmup", "20"], ["--steps", ">= 20"]),
    (["--baseline", "kiln-regional", "--rows", "plain,kiln"], ["--baseline", "not one of the rows"]),
    (["--model", "llama-3.2-2b"], ["--model", "llama-3.2-1b"]),
    (["--nproc-per-node", "0"], ["--nproc-per-node", ">= 1"]),
])
def test_bad_input_exits_2_before_any_work(tmp_path, tiny_config, bad_input, args, needles):
    out = tmp_path / "out"
    argv = ["bench", "train-llm", "--model", tiny_config, "--seq-len", "16", "--steps", "10", "--warmup", "1",
            "--lr-warmup", "2", "--device", "cpu", "--out", str(out), *args]
    bad_input(argv, needles)
    assert not out.exists()


def test_rows_train_the_same_model_on_the_same_tokens(tmp_path, tiny_config, capsys):
    out, data = tmp_path / "out", tmp_path / "data"
    code = main(["bench", "train-llm", "--model", tiny_config, "--seq-len", "16", "--batch-size", "2",
                 "--steps", "4", "--warmup", "1", "--lr-warmup", "2", "--precision", "fp32", "--device", "cpu",
                 "--no-plain-compile", "--data-dir", str(data), "--rows", "plain,kiln-eager,hf,f8",
                 "--recipe", f"hf: compile.enabled=false model.name=hf:{data / 'init'}",
                 "--recipe", "f8: precision.float8=rowwise", "--skip-invalid-recipes", "--out", str(out)])
    assert code == 0
    payload = json.loads((out / "results.json").read_text())
    rows = {r["row"]: r for r in payload["results"]}
    assert [r["status"] for r in payload["results"]] == ["ok", "ok", "ok", "error"]
    assert "CUDA" in rows["f8"]["reason"]  # float8 needs a GPU: the row fails, the others ran
    kiln, hf = rows["kiln-eager"], rows["hf"]
    # kiln's own decoder and transformers' Llama, loaded from the same weights through kiln's path,
    # train alike; the plain loop (labels = inputs: one position fewer per sequence) starts close.
    assert kiln["losses"] == pytest.approx(hf["losses"], rel=1e-4)
    assert len(kiln["losses"]) == 4 and kiln["timed_steps"] == 3
    assert rows["plain"]["loss_first"] == pytest.approx(kiln["loss_first"], rel=0.05)
    assert kiln["ref"] == "plain" and kiln["speedup_vs_ref"] > 0
    assert kiln["config"]["config"]["model"]["name"] == f"llama:{data / 'init'}"
    assert kiln["config"]["features"]["ce_kernel"] == "chunked"
    assert payload["config"]["flops_per_token"] > 0 and payload["config"]["tokens_per_step"] == 32
    md = (out / "results.md").read_text()
    assert "| kiln-eager | kiln | ok |" in md and "FLOPs/token" in md
    assert "4 rows (3 ok, 1 error)" in capsys.readouterr().out


def test_two_gloo_ranks_train_kiln_and_the_plain_fsdp2_loop_from_the_same_weights(tmp_path, tiny_config):
    """--nproc-per-node 2 on CPU: kiln's row is `kiln train` on 2 gloo ranks, the plain row the
    hand-written FSDP2 loop on 2; both read the same global batches (2 x 2 sequences) from the same
    initial weights, so their step-1 losses (the mean over both ranks, before any update) agree to
    fp32 rounding (1e-5 relative), as do the losses after the updates (1e-3: DDP's all-reduce and
    FSDP2's reduce-scatter sum the gradients in different orders)."""
    out, data = tmp_path / "out", tmp_path / "data"
    code = main(["bench", "train-llm", "--model", tiny_config, "--seq-len", "16", "--batch-size", "2",
                 "--steps", "4", "--warmup", "1", "--lr-warmup", "2", "--precision", "fp32", "--device", "cpu",
                 "--no-plain-compile", "--nproc-per-node", "2", "--data-dir", str(data),
                 "--rows", "plain,kiln-eager", "--out", str(out)])
    assert code == 0
    payload = json.loads((out / "results.json").read_text())
    rows = {r["row"]: r for r in payload["results"]}
    plain, kiln = rows["plain"], rows["kiln-eager"]
    assert plain["status"] == kiln["status"] == "ok"
    assert plain["nproc"] == kiln["nproc"] == 2 and payload["config"]["tokens_per_step"] == 2 * 2 * 16
    assert kiln["losses"][0] == pytest.approx(plain["losses"][0], rel=1e-5)
    assert kiln["losses"] == pytest.approx(plain["losses"], rel=1e-3) and len(kiln["losses"]) == 4
    assert kiln["tokens_per_s_per_gpu"] == pytest.approx(kiln["tokens_per_s"] / 2)
    assert kiln["config"]["command"][:2] == ["kiln", "train"] and kiln["applied_strategy"] in ("ddp", "fsdp")
    assert plain["config"]["job"]["mixed"] == "fp32" and plain["config"]["command"][5] == "2"
    assert kiln["params"] == plain["params"]
    assert "2 ranks per row" in (out / "results.md").read_text()


def test_ctrl_c_keeps_the_finished_rows_and_removes_the_scratch(tmp_path, tiny_config, monkeypatch, capsys):
    """Ctrl-C during the second row: results.json keeps the first; OUT/data (the corpus and initial
    weights, gigabytes for a real model) is removed, and the message says both."""
    from kiln.bench.train_llm import llm_train_run

    real = llm_train_run.run_row
    calls = []

    def second_interrupted(run):
        calls.append(run.spec.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(run)

    monkeypatch.setattr(llm_train_run, "run_row", second_interrupted)
    out = tmp_path / "out"
    code = main(["bench", "train-llm", "--model", tiny_config, "--seq-len", "16", "--batch-size", "2",
                 "--steps", "4", "--warmup", "1", "--lr-warmup", "2", "--precision", "fp32", "--device", "cpu",
                 "--no-plain-compile", "--rows", "plain,kiln-eager", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 130
    assert [r["row"] for r in json.loads((out / "results.json").read_text())["results"]] == ["plain"]
    assert not (out / "data").exists()
    assert f"kiln: interrupted: kept results.json, results.md (the rows finished before it) in {out}" in err
    assert f"removed scratch: {out / 'data'} (" in err
