"""Token ids to evaluate a model on (kiln.data.eval_tokens): id files, text, prepared directories."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.data.eval_tokens import read_ppl_tokens
from kiln.data.prepare import prepare
from kiln.data.prepare_options import PrepareOptions
from kiln.errors import ConfigError


class _Words:
    def encode(self, text):
        return [int(w[1:]) for w in text.split()]


def test_ppl_file_forms_and_errors(tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("1, 2,3\n4 5\n")
    assert read_ppl_tokens(ids, None, 256) == [1, 2, 3, 4, 5]
    text = tmp_path / "text.txt"
    text.write_text("w7 w8 w9")
    assert read_ppl_tokens(text, _Words(), 256) == [7, 8, 9]
    for content, tok, needle in (("w7 w8", None, "no tokenizer"), ("", None, "empty"), ("1 300", None, "vocabulary"),
                                 ("5", None, "at least 2")):
        bad = tmp_path / "bad.txt"
        bad.write_text(content)
        with pytest.raises(ConfigError, match=needle) as err:
            read_ppl_tokens(bad, tok, 256)
        assert err.value.key == "--ppl-file"
    with pytest.raises(ConfigError, match="cannot read"):
        read_ppl_tokens(tmp_path / "missing.txt", None, 256)


def test_ppl_from_a_prepared_directory(tmp_path):
    (tmp_path / "t.txt").write_text("".join(f"Line {i} of the text.\n" for i in range(400)))
    prepare(PrepareOptions(inputs=[str(tmp_path / "t.txt")], out=tmp_path / "d", train_bpe=300, val_fraction=0.1))
    val = np.fromfile(tmp_path / "d" / "val.bin", dtype=np.uint16)
    assert read_ppl_tokens(tmp_path / "d", None, 300) == val.tolist()
    with pytest.raises(ConfigError, match="outside the model's vocabulary"):
        read_ppl_tokens(tmp_path / "d", None, int(val.max()))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="without meta.json"):
        read_ppl_tokens(tmp_path / "empty", None, 300)
    prepare(PrepareOptions(inputs=[str(tmp_path / "t.txt")], out=tmp_path / "d0", train_bpe=300, val_fraction=0))
    with pytest.raises(ConfigError, match="no validation split"):
        read_ppl_tokens(tmp_path / "d0", None, 300)
