from __future__ import annotations

import hashlib

import pytest

from kiln.config import ConfigError
from kiln.data import text_sources
from kiln.data.prepare import pieces_are_exact
from kiln.data.tokenizers_io import train_bpe


def test_pieces_cut_only_after_lone_newlines():
    text = "alpha beta\ngamma  \ndelta\n\nepsilon\nzeta eta theta\n" * 50
    pieces = text_sources.text_pieces(text, 40)
    assert "".join(pieces) == text and len(pieces) > 10
    for p in pieces[:-1]:
        assert p.endswith("\n") and not p[-2].isspace()
    assert text_sources.text_pieces("short", 40) == ["short"]


def test_trained_bpe_tokenizes_pieces_exactly():
    text = ("Some words here.\nMore words  \n\n   indented line\nand the end\n" * 40)
    loaded = train_bpe(iter([text]), 300)
    assert pieces_are_exact(loaded.tokenizer)
    whole = loaded.tokenizer.encode(text, add_special_tokens=False).ids
    parts = [i for p in text_sources.text_pieces(text, 64)
             for i in loaded.tokenizer.encode(p, add_special_tokens=False).ids]
    assert whole == parts


def test_metaspace_tokenizer_is_not_cut():
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.train_from_iterator(["The first line.\nA second one\n"] * 10,
                            tokenizers.trainers.BpeTrainer(vocab_size=100, show_progress=False))
    assert not pieces_are_exact(tok)


def test_check_source_hashes_and_counts(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "  "}\n{"text": "two"}', encoding="utf-8")
    src = text_sources.check_source(path, "text")
    assert src.documents == 2 and src.bytes == path.stat().st_size
    assert src.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert list(text_sources.documents(src, "text")) == ["one", "two"]


def test_utf8_split_across_reads_is_fine(tmp_path, monkeypatch):
    monkeypatch.setattr(text_sources, "_READ_BYTES", 3)
    path = tmp_path / "u.txt"
    path.write_text("héllo wörld ✓\n", encoding="utf-8")
    assert text_sources.check_source(path, "text").documents == 1
    path.write_bytes("héllo".encode() + b"\xc3")
    with pytest.raises(ConfigError, match="truncated character"):
        text_sources.check_source(path, "text")


def test_directories_expand_recursively_and_once(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    for name in ("d/a.txt", "d/sub/b.md", "d/sub/c.jsonl", "d/skip.png"):
        (tmp_path / name).write_text("x")
    files = text_sources.collect_files([str(tmp_path / "d"), str(tmp_path / "d" / "a.txt")])
    assert [f.relative_to(tmp_path).as_posix() for f in files] == ["d/a.txt", "d/sub/b.md", "d/sub/c.jsonl"]


def test_a_corpus_file_read_through_a_link_is_said(tmp_path, caplog):
    (tmp_path / "elsewhere.txt").write_text("outside the corpus\n")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("inside\n")
    (tmp_path / "d" / "b.txt").symlink_to(tmp_path / "elsewhere.txt")
    with caplog.at_level("INFO", logger="kiln.data"):
        files = text_sources.collect_files([str(tmp_path / "d")])
    assert [f.name for f in files] == ["a.txt", "b.txt"]
    assert f"reading {tmp_path / 'd' / 'b.txt'} through a link: it is {tmp_path / 'elsewhere.txt'}" in caplog.text
    assert "a.txt" not in caplog.text
