"""Special tokens come from the data's tokenizer: the ids read from a tokenizer directory, a run's
model config taking them (a contradicting `model.kwargs` id is exit 2), an export of a run that
recorded other ids getting the tokenizer's, and `kiln generate` refusing stop tokens that miss the
tokenizer's end-of-text."""

from __future__ import annotations

import json

import pytest

from kiln.cli.main import main
from kiln.config import load_config
from kiln.data.special_tokens import align_config, special_tokens
from kiln.errors import ConfigError
from kiln.train.trainer import train

pytest.importorskip("transformers")

from tests.checkpoint.test_hf_export import BASE, _prepared_data  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _prepared_data(tmp_path_factory.mktemp("data") / "prepared")


def test_ids_are_read_from_the_tokenizer_files(data, tmp_path):
    tok = data.parent / "tokenizer"
    assert special_tokens(tok) == {"bos_token_id": ("<s>", 1), "eos_token_id": ("</s>", 2)}
    assert special_tokens(tmp_path) == {} and special_tokens(None) == {}
    config, changes = align_config({"bos_token_id": 0, "eos_token_id": [7, 2]}, tok)
    assert config == {"bos_token_id": 1, "eos_token_id": [7, 2]}  # a list holding the EOS agrees
    assert changes == {"bos_token_id": (0, 1)}
    with pytest.raises(ConfigError, match=r"model.kwargs.eos_token_id.*'</s>' at id 2"):
        align_config({}, tok, explicit={"eos_token_id": 5})
    assert align_config({"eos_token_id": 9}, tok, explicit={"eos_token_id": 2})[0]["eos_token_id"] == 2


def test_a_run_records_the_data_tokenizers_ids_not_the_presets(data, tmp_path):
    run = tmp_path / "run"  # hf:llama-tiny's preset says bos 0 / eos 0
    over = [*BASE, "model.name=hf:llama-tiny", "data.source=tokens", f"data.path={data}"]
    assert train(load_config(None, over), run)["status"] == "completed"
    config = json.loads((run / "model" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)


def test_a_contradicting_id_is_refused_before_any_work(data, tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", *BASE, "model.name=llama:llama-tiny", "model.kwargs.eos_token_id=5", "data.source=tokens",
                 f"data.path={data}", "--run-dir", str(run)])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kiln: error:")]
    assert code == 2 and len(errors) == 1, errors  # (a CPU run logs its thread plan first)
    assert "model.kwargs.eos_token_id" in errors[0] and "at id 2" in errors[0]
    assert not run.exists()


def test_an_older_runs_export_takes_the_tokenizers_ids_and_generate_checks_them(data, tmp_path, capsys, bad_input):
    run = tmp_path / "run"
    over = [*BASE, "model.name=llama:llama-tiny", "data.source=tokens", f"data.path={data}"]
    assert train(load_config(None, over), run)["status"] == "completed"
    recorded = json.loads((run / "model" / "config.json").read_text())
    (run / "model" / "config.json").write_text(json.dumps({**recorded, "bos_token_id": 6, "eos_token_id": 5}))
    out = tmp_path / "hf"
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert "eos_token_id 2 from the run's tokenizer (its model/config.json said 5)" in capsys.readouterr().err
    for name in ("config.json", "generation_config.json"):
        written = json.loads((out / name).read_text())
        assert (written["bos_token_id"], written["eos_token_id"]) == (1, 2), name

    # An export whose stop token is not the tokenizer's end-of-text: refused, naming the fix.
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 5}))
    gen = ["generate", "--model", str(out), "--prompt", "w4 w5", "--max-new-tokens", "2", "--device", "cpu",
           "--compile", "off"]
    bad_input(gen, ["--model", "'</s>' (id 2)", "stops at [5]", "--stop-tokens 2", "kiln export"])
    assert main([*gen, "--stop-tokens", "2"]) == 0


def test_a_vocabulary_smaller_than_the_datas_names_the_setting_that_fixes_it(tmp_path, capsys):
    from tests.data.test_prepare import english

    (tmp_path / "book.txt").write_text(english(100, 1), encoding="utf-8")
    prepared = tmp_path / "prepared"
    assert main(["data", "prepare", str(tmp_path / "book.txt"), "--train-bpe", "300", "--out", str(prepared)]) == 0
    run = tmp_path / "run"
    code = main(["train", *BASE, "model.name=llama:llama-tiny", "model.kwargs.vocab_size=280", "data.source=tokens",
                 f"data.path={prepared}", "--run-dir", str(run)])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kiln: error:")]
    assert code == 2 and len(errors) == 1, errors
    assert errors[0].startswith("kiln: error: model.kwargs.vocab_size: the model's vocabulary has 280 tokens")
    assert "set model.kwargs.vocab_size=300 (or more; llama: and hf: models)" in errors[0]
    assert not run.exists()
