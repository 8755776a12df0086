from __future__ import annotations

import json

import pytest

from kiln.cli.main import main


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("".join(f"Line {i} says the cat sat on the mat.\n" for i in range(300)), encoding="utf-8")
    return path


def run(capsys, *argv):
    code = main(["data", "prepare", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_prepare_prints_a_summary_and_plain_progress(tmp_path, text, capsys):
    code, out, err = run(capsys, text, "--train-bpe", 300, "--out", tmp_path / "out", "--val-fraction", 0.1)
    assert code == 0, err
    assert "wrote" in out and "validation tokens (uint16)" in out and "unigram perplexity" in out
    assert "kiln: tokenizing ..." in err and "kiln: training BPE ..." in err  # piped: plain lines, no bar
    code, out, _ = run(capsys, text, "--train-bpe", 300, "--out", tmp_path / "o2", "--json", "--note", "pkg 1.0")
    assert code == 0 and json.loads(out)["vocab_size"] == 300 and json.loads(out)["note"] == "pkg 1.0"


def test_existing_empty_out_directory_is_used(tmp_path, text, capsys):
    (tmp_path / "out").mkdir()
    code, _, err = run(capsys, text, "--train-bpe", 300, "--out", tmp_path / "out")
    assert code == 0, err and (tmp_path / "out" / "meta.json").is_file()


def _bad_inputs(tmp_path, text):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("  \n\n")
    (tmp_path / "garbage.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\nnot json\n')
    (tmp_path / "nofield.jsonl").write_text('{"body": "ok"}\n')
    (tmp_path / "notstr.jsonl").write_text('{"text": 3}\n')
    (tmp_path / "nodocs").mkdir()
    (tmp_path / "nodocs" / "x.png").write_bytes(b"\x89PNG")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("keep me")
    (tmp_path / "afile").write_text("x")
    return {
        "missing": ([tmp_path / "nope.txt", "--train-bpe", 300], "nope.txt"),
        "empty": ([tmp_path / "empty.txt", "--train-bpe", 300], "empty.txt is empty"),
        "blank": ([tmp_path / "blank.txt", "--train-bpe", 300], "blank.txt holds no text"),
        "binary": ([tmp_path / "garbage.bin", "--train-bpe", 300], "garbage.bin is binary"),
        "not utf-8": ([tmp_path / "latin1.txt", "--train-bpe", 300], "latin1.txt is not UTF-8"),
        "bad jsonl": ([tmp_path / "bad.jsonl", "--train-bpe", 300], "bad.jsonl:2 is not a JSON object"),
        "no field": ([tmp_path / "nofield.jsonl", "--train-bpe", 300], "--text-field: .*has no field 'text'"),
        "not a string": ([tmp_path / "notstr.jsonl", "--train-bpe", 300], "--text-field: .*is a int"),
        "dir without text": ([tmp_path / "nodocs", "--train-bpe", 300], "nodocs holds no text files"),
        "vocab over dtype": ([text, "--train-bpe", 70000, "--dtype", "uint16"], "--dtype: .*70000 tokens does not fit"),
        "vocab too small": ([text, "--train-bpe", 100], "--train-bpe: .*at least 257"),
        "vocab too large": ([text, "--train-bpe", 99999999999], "--train-bpe: 99999999999 tokens is more than the"),
        "val fraction": ([text, "--train-bpe", 300, "--val-fraction", 1.5], "--val-fraction"),
        "no tokenizer dir": ([text, "--tokenizer", tmp_path / "nodir"], "--tokenizer: no such directory"),
        "tokenizer dir without json": ([text, "--tokenizer", tmp_path / "full"], "--tokenizer: .*no tokenizer.json"),
    }


CASES = ("missing", "empty", "blank", "binary", "not utf-8", "bad jsonl", "no field", "not a string",
         "dir without text", "vocab over dtype", "vocab too small", "vocab too large", "val fraction", "no tokenizer dir",
         "tokenizer dir without json")


@pytest.mark.parametrize("case", CASES)
def test_bad_input_exits_2_naming_it_and_writes_nothing(tmp_path, text, capsys, case):
    import re

    argv, message = _bad_inputs(tmp_path, text)[case]
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = run(capsys, *argv, "--out", tmp_path / "out")
    assert code == 2
    assert re.search(message, err), err
    assert len(err.strip().splitlines()) == 1 and "checking" not in err  # one line, before any work
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("target", ["full", "afile"])
def test_out_that_exists_is_refused_and_kept(tmp_path, text, capsys, target):
    _bad_inputs(tmp_path, text)
    code, _, err = run(capsys, text, "--train-bpe", 300, "--out", tmp_path / target)
    assert code == 2 and "--out" in err and target in err
    assert (tmp_path / "full" / "keep.txt").read_text() == "keep me" and (tmp_path / "afile").read_text() == "x"


def test_existing_tokenizer_over_uint16(tmp_path, text, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"w{i}": i for i in range(70_000)}
    vocab["[UNK]"] = 70_000
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    (tmp_path / "big").mkdir()
    tok.save(str(tmp_path / "big" / "tokenizer.json"))
    code, _, err = run(capsys, text, "--tokenizer", tmp_path / "big", "--dtype", "uint16", "--out", tmp_path / "out")
    assert code == 2 and "--dtype" in err and "70001 tokens does not fit uint16" in err
    assert not (tmp_path / "out").exists()
    code, _, err = run(capsys, text, "--tokenizer", tmp_path / "big", "--out", tmp_path / "out")
    assert code == 0, err
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["dtype"] == "uint32" and meta["eos_token_id"] is None and meta["eos"].startswith("none")
