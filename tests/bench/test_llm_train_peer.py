"""torchtitan's row: the flavor that reproduces a Llama config, the job file, overrides, the
metrics it records and the error it reports. torchtitan itself is exercised where it imports
(its launcher test is skipped without it)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.bench.peers.torchtitan import job_file as peer
from kiln.llm.presets import PRESETS


def _titan_width(dim: int, multiple_of: int, multiplier: float | None) -> int:
    """torchtitan 0.2.2's SwiGLU width rule (FeedForward.__init__), restated to check against."""
    hidden = int(2 * 4 * dim / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@pytest.mark.parametrize("name", ["llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b"])
def test_flavor_reproduces_the_llama_shapes(name):
    hf = {**PRESETS[name], "tie_word_embeddings": False}
    args = peer.flavor_args(hf, 2048)
    assert isinstance(args, dict)
    assert _titan_width(args["dim"], args["multiple_of"], args["ffn_dim_multiplier"]) == hf["intermediate_size"]
    assert args["dim"] // args["n_heads"] == hf["head_dim"]
    assert (args["n_layers"], args["n_kv_heads"], args["vocab_size"]) == (
        hf["num_hidden_layers"], hf["num_key_value_heads"], hf["vocab_size"])
    assert args["rope_theta"] == 500000.0 and args["rope_scaling_args"]["scaling_factor"] == hf["rope_scaling"]["factor"]
    assert args["max_seq_len"] == 131072


def test_flavor_with_a_width_below_two_thirds_uses_a_multiplier():
    hf = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "vocab_size": 512, "tie_word_embeddings": False}
    args = peer.flavor_args(hf, 32)
    assert args["ffn_dim_multiplier"] < 1
    assert _titan_width(64, args["multiple_of"], args["ffn_dim_multiplier"]) == 128
    assert args["rope_scaling_args"]["scaling_factor"] == 1.0  # no RoPE scaling in the config


@pytest.mark.parametrize(("change", "needle"), [
    ({"tie_word_embeddings": True}, "tied embeddings"),
    ({"head_dim": 128}, "head size"),
    ({"model_type": "qwen2"}, "model_type"),
    ({"attention_bias": True}, "biases"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "RoPE scaling"),
])
def test_flavor_refuses_what_torchtitan_cannot_build(change, needle):
    hf = {**PRESETS["llama-3.2-1b"], "tie_word_embeddings": False, **change}
    reason = peer.flavor_args(hf, 2048)
    assert isinstance(reason, str) and needle in reason


def _job(tmp_path, **kw):
    base = dict(workdir=tmp_path / "w", tokenizer_dir=tmp_path / "tok", dataset_dir=tmp_path / "text",
                weights_dir=tmp_path / "init", batch=4, seq_len=2048, steps=50, seed=0, lr=3e-4, betas=(0.9, 0.95),
                eps=1e-8, weight_decay=0.0, warmup_steps=10, max_norm=1.0)
    return peer.PeerJob(**{**base, **kw})


def test_job_matches_the_bench_and_takes_overrides(tmp_path):
    from kiln.config.load import tomllib

    tables = peer.apply_overrides(peer.job_config(_job(tmp_path)),
                                  ["activation_checkpoint.mode=selective", "compile.enable=false",
                                   "training.dataset=c4_test", "quantize.linear.float8.recipe_name=rowwise"])
    path = peer.write_job(tmp_path / "job.toml", tables)
    job = tomllib.loads(path.read_text())
    assert job["training"]["local_batch_size"] == 4 and job["training"]["seq_len"] == 2048
    assert job["training"]["steps"] == 50 and job["training"]["max_norm"] == 1.0
    assert job["training"]["dataset_path"] == str(tmp_path / "text")
    assert job["optimizer"]["beta2"] == 0.95 and job["optimizer"]["weight_decay"] == 0.0
    assert job["lr_scheduler"] == {"warmup_steps": 10, "decay_ratio": 0.0}
    assert job["checkpoint"]["initial_load_in_hf"] is True and job["checkpoint"]["load_only"] is True
    assert job["metrics"]["log_freq"] == 1 and job["model"]["flavor"] == peer.FLAVOR
    assert job["activation_checkpoint"]["mode"] == "selective" and job["compile"]["enable"] is False
    assert job["quantize"] == {"linear": {"float8": {"recipe_name": "rowwise"}}}
    with pytest.raises(ValueError, match="section.key=value"):
        peer.apply_overrides({}, ["nodot=1"])


def test_metrics_and_errors_are_read_back(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"step": 1, "loss_metrics/global_avg_loss": 11.9}) + "\n\n"
                    + json.dumps({"step": 2, "loss_metrics/global_avg_loss": 11.5}) + "\n")
    assert [m["step"] for m in peer.read_metrics(path)] == [1, 2]
    assert peer.read_metrics(tmp_path / "none.jsonl") == []
    text = ("Traceback (most recent call last):\n  File x\nValueError: bad flavor\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n==== \n")
    assert peer.last_error(text) == "ValueError: bad flavor"


def test_run_skips_a_shape_torchtitan_cannot_build(tmp_path):
    row = peer.run(_job(tmp_path), {**PRESETS["llama-3.2-1b"]}, [], timeout_s=10)
    assert row["status"] == "skipped" and "tied" in row["reason"]
    assert not (tmp_path / "w").exists()


def test_launcher_ships_inside_the_package():
    # Found beside the peer's module (an installed wheel has no checkout around it), as a .py file
    # of the package, so setuptools ships it without package-data.
    launcher = peer.launcher_path()
    assert launcher.is_file() and launcher.suffix == ".py"
    assert launcher.parent == Path(peer.__file__).resolve().parent


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="torchtitan is not installed")
def test_launcher_registers_the_flavor_and_builds_it(tmp_path):
    hf = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": False}
    args = tmp_path / "args.json"
    args.write_text(json.dumps(peer.flavor_args(hf, 32)))
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import torchtitan_llama as t; "
            "a = t.register('kiln-test', json.load(open(sys.argv[2])), None); "
            "print(json.dumps(t.describe('kiln-test', a)))")
    out = subprocess.run([sys.executable, "-c", code, str(peer.launcher_path().parent), str(args)],
                         capture_output=True, text=True, timeout=300, check=True)
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["ffn_hidden"] == 128 and info["torchtitan"].startswith("0.2")
    # Embedding + LM head + per layer (q, k, v, o, three MLP matrices, two norms) + the final norm.
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert info["params"] == 2 * 512 * 64 + 2 * per_layer + 64


def test_a_peer_recipe_is_a_torchtitan_row_with_its_own_settings(tmp_path, monkeypatch):
    """`--peer-recipe 'NAME: torchtitan SECTION.KEY=VALUE ...'`: a second torchtitan row whose settings
    come after --torchtitan-set's, in a job directory of its own, and are recorded on its row."""
    from types import SimpleNamespace

    from kiln.bench.peers.torchtitan.peer import TORCHTITAN
    from kiln.bench.train_llm.llm_train_check import check_train_llm
    from kiln.bench.train_llm.llm_train_request import TrainLlmRequest

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({**PRESETS["llama-tiny"], "head_dim": 16}))
    opts = check_train_llm(TrainLlmRequest(
        model=str(config), seq_len=16, steps=10, warmup=1, lr_warmup=2, device="cpu",
        rows=["torchtitan", "tt-noac"], torchtitan_set=["compile.enable=false"],
        peer_recipe=["tt-noac: torchtitan activation_checkpoint.mode=none 'job.description=no AC'"]))
    assert [(r.name, r.kind, r.overrides) for r in opts.rows] == [
        ("torchtitan", "torchtitan", ()),
        ("tt-noac", "torchtitan", ("activation_checkpoint.mode=none", "job.description=no AC"))]
    assert opts.hf["tie_word_embeddings"] is False  # torchtitan's Llama cannot tie, as for its default row
    seen = []
    monkeypatch.setattr(peer, "run", lambda job, hf, overrides, timeout: seen.append((job.workdir, overrides))
                        or {"status": "error", "reason": "stopped here"})
    corpus = SimpleNamespace(tokenizer_dir=tmp_path / "tok", dataset_dir=tmp_path / "text")
    ctx = SimpleNamespace(data_dir=tmp_path / "data", corpus=corpus, weights_dir=tmp_path / "init", nproc=2)
    rows = []
    for spec in opts.rows:
        run = SimpleNamespace(spec=spec, opts=opts, ctx=ctx, batches=[], deadline_left_s=None)
        rows += TORCHTITAN.run(TORCHTITAN.prepare(run), run)
    assert seen == [(tmp_path / "data/torchtitan", ["compile.enable=false"]),
                    (tmp_path / "data/tt-noac", ["compile.enable=false", "activation_checkpoint.mode=none",
                                                 "job.description=no AC"])]
    assert "overrides" not in rows[0].to_json() and rows[1].overrides == list(opts.rows[1].overrides)
