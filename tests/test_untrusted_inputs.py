"""Every file kiln reads from a run dir, a checkpoint, a data path or a model dir is untrusted: a
crafted pickle in any of them never runs (each case plants a payload that would create a canary
file, and checks kiln refuses the file without creating it). compile_cache.bin: see
tests/train/test_compile_cache.py; DCP `.metadata`: tests/checkpoint/test_ckpt_roundtrip.py."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch


class Payload:
    def __init__(self, canary) -> None:
        self.canary = str(canary)

    def __reduce__(self):
        return (os.system, (f"touch {self.canary}",))


@pytest.fixture
def canary(tmp_path):
    path = tmp_path / "PAYLOAD_RAN"
    yield path
    assert not path.exists(), "a crafted pickle ran"


def test_a_non_tensor_value_in_a_checkpoint_is_read_without_unpickling_code(tmp_path, canary):
    import torch.distributed.checkpoint as dcp

    from kiln.checkpoint.dcp_io import CheckpointReadError, dcp_load, quiet_single_process

    with quiet_single_process():
        dcp.save({"app": {"w": torch.ones(2), "extra": Payload(canary)}}, checkpoint_id=tmp_path / "ck")
    with pytest.raises(CheckpointReadError, match="reading checkpoint"):
        dcp_load({"app": {"w": torch.zeros(2), "extra": None}}, tmp_path / "ck")


@pytest.mark.parametrize("ext", [".pt", ".npy"])
def test_a_data_file_holding_a_pickle_is_refused(tmp_path, canary, ext):
    from kiln.data.files import load_array
    from kiln.errors import ConfigError

    path = tmp_path / f"inputs{ext}"
    if ext == ".pt":
        torch.save({"x": Payload(canary)}, path)
    else:
        np.save(path, np.array([Payload(canary)], dtype=object), allow_pickle=True)
    with pytest.raises(ConfigError, match="data.path"):
        load_array("data.path", str(path))


def test_a_model_dir_with_a_pickled_checkpoint_is_refused_by_generate(tmp_path, canary, bad_input):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": 64}))
    with open(tmp_path / "model" / "pytorch_model.bin", "wb") as f:
        pickle.dump(Payload(canary), f)
    bad_input(["generate", "--model", str(tmp_path / "model"), "--tokens", "1,2", "--max-new-tokens", "1",
               "--device", "cpu"], ["--model", "safetensors"])


def test_a_model_dir_with_a_pickled_checkpoint_is_refused_for_training(tmp_path, canary):
    pytest.importorskip("transformers")
    from kiln.config import load_config
    from kiln.errors import ConfigError
    from kiln.models import build_model

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": 64}))
    with open(model_dir / "pytorch_model.bin", "wb") as f:
        pickle.dump(Payload(canary), f)
    with pytest.raises(ConfigError, match="safetensors only"):
        build_model(load_config(None, [f"model.name=hf:{model_dir}"]).model)


def test_run_dir_bookkeeping_files_are_plain_data(tmp_path, canary):
    """config.toml, summary.json, metrics.jsonl, completion markers, branch.json: parsed as TOML/JSON
    only, so a planted pickle is just unreadable text."""
    from kiln.checkpoint.layout import checkpoint_problem
    from kiln.checkpoint.timeline import branch_point
    from kiln.monitor.records import read_records
    from kiln.train.rundir import inspect_run_dir

    blob = pickle.dumps(Payload(canary))
    for name in ("config.toml", "summary.json", "metrics.jsonl"):
        (tmp_path / name).write_bytes(blob)
    state = inspect_run_dir(tmp_path)
    assert state.saved_identity is None and state.status is None
    assert read_records(tmp_path / "metrics.jsonl", warn=False) == []
    step = tmp_path / "checkpoints" / "step_00000001"
    step.mkdir(parents=True)
    (step / "kiln_complete.json").write_bytes(blob)
    (tmp_path / "checkpoints" / "branch.json").write_bytes(blob)
    assert "marker" in checkpoint_problem(step)
    from kiln.errors import ConfigError

    with pytest.raises(ConfigError, match="branch.json: cannot be read"):  # refused, never a restart
        branch_point(tmp_path / "checkpoints")
