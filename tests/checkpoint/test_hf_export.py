"""`kiln export RUN_DIR --out DIR`: a llama: or hf: run as a Hugging Face directory that transformers
and `kiln generate` load, with the data's tokenizer when the run has one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from kiln.cli.main import main
from kiln.config import load_config
from kiln.train.trainer import train

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from tests.llm.conftest import write_tokenizer  # noqa: E402

BASE = ["data.batch_size=2", "data.seq_len=16", "training.steps=2", "training.device=cpu", "data.num_workers=0",
        "optim.lr=1e-2", "metrics.console=false", "metrics.tensorboard=false"]


def _prepared_data(root: Path) -> Path:
    """A prepared data dir as `kiln data prepare` writes it: train.bin, meta.json naming tokenizer/."""
    root.mkdir(parents=True)
    (root / "tokenizer").mkdir()
    write_tokenizer(root / "tokenizer")
    (root / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    (root / "tokenizer" / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    np.random.default_rng(0).integers(3, 96, size=2000, dtype=np.uint16).tofile(root / "train.bin")
    (root / "meta.json").write_text(json.dumps({"tokenizer": "tokenizer", "vocab_size": 96}))
    (root / "tokenizer" / "notes.bin").write_bytes(b"not a tokenizer file")  # never copied
    return root / "train.bin"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return _prepared_data(tmp_path_factory.mktemp("data") / "prepared")


def _run(tmp_path: Path, name: str, *extra: str, data_path: Path | None = None) -> Path:
    run_dir = tmp_path / name
    over = [*BASE, *extra]
    if data_path is not None:
        over += ["data.source=tokens", f"data.path={data_path}"]
    assert train(load_config(None, over), run_dir)["status"] == "completed"
    return run_dir


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A llama-tiny run without a tokenizer, trained once: the tests below only export it (an export
    reads the run dir and writes only under its --out, which each test puts in its own tmp_path)."""
    return _run(tmp_path_factory.mktemp("tiny"), "run", "model.name=llama:llama-tiny", "data.synthetic_samples=16")


def _kiln_weights(run_dir: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's model under the training model's own names (the one-file export)."""
    out = tmp_path / f"{run_dir.name}.safetensors"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    return safetensors_torch.load_file(str(out))


def _hf_logits(directory: Path, tokens: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits


TOKENS = torch.tensor([[1, 5, 9, 33, 70, 2, 8, 8, 41]])


@pytest.mark.parametrize("tied", [False, True])
def test_llama_run_exports_a_directory_transformers_loads_with_equal_logits(tmp_path, data, tied):
    from kiln.llm.model import Decoder
    from kiln.models.llama import llama_source

    extra = ["model.name=llama:llama-tiny", f"model.kwargs.tie_word_embeddings={str(tied).lower()}"]
    run_dir = _run(tmp_path, "run", *extra, data_path=data)
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    files = {p.name for p in out.iterdir()}
    assert files == {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                     "tokenizer_config.json", "special_tokens_map.json"}
    assert not (tmp_path / "hf.part").exists()
    exported = safetensors_torch.load_file(str(out / "model.safetensors"))
    assert ("lm_head.weight" in exported) is not tied
    assert "model.layers.0.self_attn.q_proj.weight" in exported

    trained = Decoder(llama_source("llama-tiny", {"tie_word_embeddings": tied}).config)
    trained.load_state_dict(_kiln_weights(run_dir, tmp_path), strict=not tied)
    with torch.no_grad():
        expected = trained(TOKENS)
    torch.testing.assert_close(_hf_logits(out, TOKENS), expected, rtol=1e-5, atol=1e-5)

    # ... and training starts from it again: llama:<dir> loads the same weights.
    from kiln.config.schema import ModelConfig
    from kiln.models import build_model

    again = build_model(ModelConfig(name=f"llama:{out}")).module.state_dict()
    for name, value in trained.state_dict().items():
        assert torch.equal(again[name], value), name

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tokenizer("w4 w5")["input_ids"] == [1, 7, 8]
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["bos_token_id"] == 1 and generation["eos_token_id"] == 2


def test_tokenizer_found_from_the_file_or_the_prepared_directory(data):
    from kiln.checkpoint.hf_export import tokenizer_dir_of

    assert tokenizer_dir_of(data) == tokenizer_dir_of(data.parent) == data.parent / "tokenizer"
    assert tokenizer_dir_of(data.parent / "tokenizer") is None  # no meta.json there
    assert tokenizer_dir_of("") is None


def test_kiln_generate_loads_the_export(tmp_path, data, capsys):
    run_dir = _run(tmp_path, "run", "model.name=llama:llama-tiny", data_path=data)
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    code = main(["generate", "--model", str(out), "--prompt", "w4 w5 w6", "--max-new-tokens", "4", "--ignore-eos",
                 "--device", "cpu", "--compile", "off", "--json", str(tmp_path / "gen.json")])
    assert code == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "gen.json").read_text())
    tokens = result["tokens"][0]
    assert len(tokens) == 4
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    prompt = torch.tensor([[1, 7, 8, 9]])
    greedy = model.generate(prompt, max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert greedy[0, 4:].tolist() == tokens


def test_hf_run_exports_a_directory_with_equal_logits(tmp_path, data):
    run_dir = _run(tmp_path, "run", "model.name=hf:llama-tiny", data_path=data)
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    assert (out / "tokenizer.json").is_file()
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    reference.load_state_dict(_kiln_weights(run_dir, tmp_path))
    with torch.no_grad():
        expected = reference(TOKENS).logits
    torch.testing.assert_close(_hf_logits(out, TOKENS), expected, rtol=0, atol=0)


def test_run_without_a_tokenizer_exports_model_files_only(tmp_path, tiny_run):
    run_dir = tiny_run
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "generation_config.json"}


def test_bad_outputs_and_runs_exit_2(tmp_path, capsys, tiny_run):
    run_dir = tiny_run
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    cases = [([str(run_dir), "--out", str(existing)], "already exists"),
             ([str(run_dir), "--out", str(tmp_path / "model.pt")], "must end in .safetensors"),
             ([str(_run(tmp_path, "mlp", "data.synthetic_samples=64")), "--out", str(tmp_path / "x")],
              "model/config.json")]
    for args, needle in cases:
        assert main(["export", *args]) == 2
        assert needle in capsys.readouterr().err
    assert (existing / "keep.txt").read_text() == "mine"


def test_a_directory_named_like_a_part_is_never_touched(tmp_path, capsys, tiny_run):
    """The export is written under a fresh temporary name: a `hf.part` of the user's (or a link
    planted there) is neither used nor removed."""
    run_dir = tiny_run
    part = tmp_path / "hf.part"
    part.mkdir()
    (part / "mine.txt").write_text("keep")
    assert main(["export", str(run_dir), "--out", str(tmp_path / "hf")]) == 0
    assert sorted(p.name for p in part.iterdir()) == ["mine.txt"] and (tmp_path / "hf" / "config.json").is_file()


def test_force_replaces_an_earlier_export_directory_whole_and_nothing_else(tmp_path, capsys, tiny_run):
    run_dir = tiny_run
    out = tmp_path / "hf"
    out.mkdir()
    (out / "stale.txt").write_text("the user's file")
    assert main(["export", str(run_dir), "--out", str(out)]) == 2  # refused without --force, untouched
    assert main(["export", str(run_dir), "--out", str(out), "--force"]) == 2  # not a kiln export: refused
    assert "is not an earlier kiln export (it holds what a kiln export never writes (stale.txt))" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["stale.txt"]
    (out / "stale.txt").unlink()
    out.rmdir()
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    (out / "config.json").write_text("{}")  # an earlier export, whatever became of its config
    capsys.readouterr()
    assert main(["export", str(run_dir), "--out", str(out), "--force"]) == 0
    assert f"the earlier export at {out} was replaced" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text()) != {}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("hf")) == ["hf"]  # no .part, no old copy
