"""kiln's own decoder through `kiln train` (model.name=llama:...): trains, resumes bitwise, takes
any seq_len up to its position limit, refuses bad feature settings with exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.torch import load_file

from kiln.cli.main import main
from kiln.config import load_config
from kiln.train.trainer import train

BASE = [
    "model.name=llama:llama-tiny", "data.batch_size=4", "data.seq_len=32", "data.synthetic_samples=64",
    "training.steps=8", "training.log_interval=2", "training.device=cpu", "training.deterministic=true",
    "optim.lr=3e-3", "metrics.console=false", "metrics.tensorboard=false",
]


@pytest.fixture
def bad_input(capsys):
    """`bad_input(argv, needles)`: `kiln ARGV` exits 2 with one error line naming every needle (a CPU
    run logs its thread plan first)."""

    def check(argv, needles):
        code = main(argv)
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kiln: error:")]
        assert code == 2 and len(errors) == 1, errors
        for needle in needles:
            assert needle in errors[0]

    return check


def _weights(run_dir, out):
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    return load_file(str(out))


@pytest.mark.parametrize("extra", [[], ["training.activation_checkpointing=selective", "training.ce_kernel=plain"],
                                   ["precision.policy=bf16-master", "training.grad_clip=0.5"]],
                         ids=["chunked-ce", "selective-ac-plain-ce", "bf16-master-clipped"])
def test_trains_and_resumes_bitwise(tmp_path, monkeypatch, extra):
    over = [*BASE, *extra, "checkpoint.interval=4"]
    clean = train(load_config(None, over), tmp_path / "clean")
    assert clean["status"] == "completed" and clean["final_loss"] < clean["first_loss"]
    assert clean["task"] == "causal_lm" and clean["tokens_per_s"] > 0
    features = clean["features"]
    assert features["ce_kernel"] == ("plain" if "training.ce_kernel=plain" in extra else "chunked")
    assert features["attention"]["kernel"] in ("flash", "math")  # SDPA's CPU kernels
    assert json.loads((tmp_path / "clean" / "model" / "config.json").read_text())["model_type"] == "llama"

    monkeypatch.setenv("KILN_FAULT", "host-oom@6")  # dies after step 6; the step-4 checkpoint stays
    with pytest.raises(MemoryError):
        train(load_config(None, over), tmp_path / "crashed")
    monkeypatch.delenv("KILN_FAULT")
    resumed = train(load_config(None, over), tmp_path / "crashed")
    assert resumed["resumed_from"].endswith("step_00000004")
    a, b = _weights(tmp_path / "clean", tmp_path / "a.safetensors"), _weights(tmp_path / "crashed", tmp_path / "b.safetensors")
    assert a.keys() == b.keys() and "layers.0.attn.wqkv.weight" in a
    for key in a:
        assert a[key].equal(b[key]), key


def test_seq_len_up_to_the_position_limit(tmp_path):
    # llama-tiny takes 256 positions; the default sequence length (256 here) is not a ceiling
    # below it, and a token file of any length gives windows of the requested length.
    tokens = np.random.default_rng(0).integers(0, 512, size=3000, dtype=np.uint16)
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    over = [*BASE, "data.source=tokens", f"data.path={path}", "data.seq_len=256", "data.batch_size=2",
            "training.steps=2", "data.num_workers=0", "model.kwargs.num_hidden_layers=1"]
    summary = train(load_config(None, over), tmp_path / "run")
    assert summary["status"] == "completed"
    assert summary["tokens_per_s"] == pytest.approx(summary["samples_per_s"] * 256, rel=1e-6)


@pytest.mark.parametrize("source", ["synthetic", "tokens"])
def test_seq_len_past_the_position_limit_is_bad_input(tmp_path, bad_input, source):
    path = tmp_path / "train.bin"
    np.zeros(5000, dtype=np.uint16).tofile(path)
    run_dir = tmp_path / "run"
    bad_input(["train", "--run-dir", str(run_dir), *BASE, f"data.source={source}", f"data.path={path}",
               "data.seq_len=257"], ["data.seq_len", "257", "256", "max_position_embeddings"])
    assert not run_dir.exists()


def test_seq_len_limit_follows_a_kwargs_override(tmp_path, bad_input):
    bad_input(["train", "--run-dir", str(tmp_path / "run"), *BASE, "model.kwargs.max_position_embeddings=16"],
              ["data.seq_len", "32", "16"])


def test_hf_models_take_seq_len_past_their_default_length(tmp_path):
    # With 512 positions hf:llama-tiny still declares 256 as its default length: not a ceiling.
    over = [*BASE, "model.name=hf:llama-tiny", "data.seq_len=300", "data.batch_size=2", "training.steps=1",
            "model.kwargs.num_hidden_layers=1", "model.kwargs.max_position_embeddings=512", "training.ce_kernel=auto"]
    summary = train(load_config(None, over), tmp_path / "run")
    assert summary["status"] == "completed" and summary["features"]["ce_kernel"] == "plain"


@pytest.mark.parametrize(("override", "needles"), [
    ("precision.float8=rowwise", ["precision.float8", "CUDA", "cpu"]),
    ("precision.float8=fast", ["precision.float8", "tensorwise", "rowwise"]),
    ("training.ce_kernel=fused", ["training.ce_kernel", "chunked", "liger"]),
    ("training.activation_checkpointing=some", ["training.activation_checkpointing", "selective"]),
    ("model.attention=sdpa", ["model.attention", "flash", "cudnn"]),
    ("model.attention=cudnn", ["model.attention", "'cudnn'", "cpu"]),
    ("model.kwargs.num_layers=3", ["model.kwargs.num_layers", "num_hidden_layers"]),
])
def test_bad_feature_settings_exit_2_before_any_work(tmp_path, bad_input, override, needles):
    run_dir = tmp_path / "run"
    bad_input(["train", "--run-dir", str(run_dir), *BASE, override], needles)
    assert not run_dir.exists()


def test_fused_cross_entropy_needs_a_model_with_hidden_states(tmp_path, bad_input):
    bad_input(["train", "--run-dir", str(tmp_path / "run"), *BASE, "model.name=hf:llama-tiny",
               "training.ce_kernel=chunked"], ["training.ce_kernel", "llama:"])


def test_unknown_llama_spec_suggests_a_preset(tmp_path, bad_input):
    bad_input(["train", "--run-dir", str(tmp_path / "run"), *BASE, "model.name=llama:llama-3.2-1", ],
              ["model.name", "llama-3.2-1b"])


@pytest.mark.parametrize("extra", [["compile.regional=true", "training.activation_checkpointing=selective"],
                                   ["compile.scope=model+loss"]], ids=["regional+sac", "model+loss"])
def test_compiles_per_block_and_with_the_fused_loss_without_graph_breaks(tmp_path, extra):
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # counts since the last reset: other tests' compiles are not ours
    over = [*BASE, "training.steps=2", "compile.enabled=true", "compile.backend=aot_eager",
            "model.kwargs.num_hidden_layers=1", *extra]
    summary = train(load_config(None, over), tmp_path / "run")
    assert summary["status"] == "completed" and summary["features"]["ce_kernel"] == "chunked"
    assert summary["compile"]["graph_breaks"] == 0 and summary["compile"]["graphs"] >= 1


def test_flops_counted_on_one_sequence_equal_the_whole_batch(tmp_path):
    import torch

    from kiln.config.schema import ModelConfig
    from kiln.models import build_model
    from kiln.monitor.flops import count_step_flops
    from kiln.train.losses import build_forward_loss

    summary = train(load_config(None, [*BASE, "training.steps=1"]), tmp_path / "run")
    built = build_model(ModelConfig(name="llama:llama-tiny"))
    tokens = torch.randint(512, (4, 32))
    whole = count_step_flops(lambda: build_forward_loss(built.module, "causal_lm")(tokens, tokens).backward())
    assert summary["flops_per_step"] == whole
