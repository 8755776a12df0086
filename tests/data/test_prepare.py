from __future__ import annotations

import json
import math
import random
from typing import get_args

import numpy as np
import pytest

from kiln.config import ConfigError, DataConfig
from kiln.data import build_data
from kiln.data.prepare import prepare, split_block_size, val_blocks
from kiln.data.prepare_options import PrepareOptions, TokenDtype
from kiln.data.prepared import DTYPE_CHOICES, dtype_for, read_prepared, unigram_perplexity

WORDS = ("the quick brown fox jumps over a lazy dog while seven wise owls watch from an old oak tree and "
         "nobody knows why the river keeps singing about bread cheese apples ships kings cabbages").split()


def english(n_sentences: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_sentences):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
        lines.append(" ".join(words).capitalize() + ".")
    return "\n".join(lines) + "\n"


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "a.txt").write_text(english(600, 1), encoding="utf-8")
    with open(tmp_path / "b.jsonl", "w", encoding="utf-8") as f:
        for i in range(40):
            f.write(json.dumps({"id": i, "text": english(5, 100 + i)}) + "\n")
    return tmp_path


def opts(corpus, **kw) -> PrepareOptions:
    base = dict(inputs=[str(corpus / "a.txt"), str(corpus / "b.jsonl")], out=corpus / "out", train_bpe=320,
                val_fraction=0.1)
    return PrepareOptions(**{**base, **kw})


def test_the_dtype_flag_offers_the_layouts_dtypes():
    assert get_args(TokenDtype) == DTYPE_CHOICES


def test_a_note_is_recorded_in_meta_json(corpus):
    assert prepare(opts(corpus, note="from the fixture"))["note"] == "from the fixture"
    assert "note" not in prepare(opts(corpus, out=corpus / "out2"))


def test_prepare_trains_bpe_splits_and_writes_the_layout(corpus):
    meta = prepare(opts(corpus))
    out = corpus / "out"
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "tokenizer", "train.bin", "val.bin"]
    assert json.loads((out / "meta.json").read_text()) == meta
    assert meta["format"] == "kiln-tokens" and meta["tokenizer"] == "tokenizer" and meta["dtype"] == "uint16"
    assert meta["vocab_size"] == 320 and meta["documents"] == 41
    train = np.fromfile(out / "train.bin", dtype=np.uint16)
    val = np.fromfile(out / "val.bin", dtype=np.uint16)
    assert meta["splits"]["train"]["tokens"] == train.size and meta["splits"]["val"]["tokens"] == val.size
    assert train.size + val.size == meta["tokens"]
    assert val.size == pytest.approx(0.1 * meta["tokens"], rel=0.15)
    # one EOS per document, and the ids decode back to the text
    eos = meta["eos_token_id"]
    assert int((train == eos).sum() + (val == eos).sum()) == 41
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer" / "tokenizer.json"))
    first = train[: int(np.argmax(train == eos))] if (train == eos).any() else train
    assert (corpus / "a.txt").read_text().startswith(tok.decode(first[:200].tolist()))
    src = {s["path"]: s for s in meta["sources"]}
    a = src[str(corpus / "a.txt")]
    assert a["bytes"] == (corpus / "a.txt").stat().st_size and len(a["sha256"]) == 64 and a["format"] == "text"
    assert src[str(corpus / "b.jsonl")]["documents"] == 40
    assert meta["unigram_val_perplexity"] == pytest.approx(unigram_perplexity(train, val, 320))


def test_the_split_reassembles_the_token_stream(corpus):
    """Interleaving train and val blocks back by the split rule gives the one-split stream."""
    whole = prepare(opts(corpus, out=corpus / "whole", val_fraction=0.0))
    assert whole["splits"].keys() == {"train"} and not (corpus / "whole" / "val.bin").exists()
    stream = np.fromfile(corpus / "whole" / "train.bin", dtype=np.uint16)
    meta = prepare(opts(corpus))
    train = np.fromfile(corpus / "out" / "train.bin", dtype=np.uint16)
    val = np.fromfile(corpus / "out" / "val.bin", dtype=np.uint16)
    block = meta["split"]["block_tokens"]
    n_blocks = -(-stream.size // block)
    mask = val_blocks(n_blocks, 0.1)
    rebuilt, t, v = [], 0, 0
    for i in range(n_blocks):
        size = min(block, stream.size - i * block)
        if mask[i]:
            rebuilt.append(val[v: v + size])
            v += size
        else:
            rebuilt.append(train[t: t + size])
            t += size
    assert np.array_equal(np.concatenate(rebuilt), stream)


def test_split_rule():
    assert val_blocks(10, 0.1).tolist() == [False] * 9 + [True]
    assert val_blocks(6, 0.5).tolist() == [False, True] * 3
    mask = val_blocks(1000, 0.013)
    assert mask.sum() == math.floor(1000 * 0.013)
    assert split_block_size(10_000_000, 0.01, 2048) == 2048
    assert split_block_size(20_000, 0.1, 2048) == 2000 // 8
    assert split_block_size(10, 0.1, 2048) == 1


def test_unigram_perplexity_formula():
    train = np.array([0, 0, 1, 2, 2, 2])
    val = np.array([0, 2, 3])
    v = 4
    p = {t: (list(train).count(t) + 1) / (len(train) + v) for t in range(v)}
    expected = math.exp(-sum(math.log(p[t]) for t in val) / len(val))
    assert unigram_perplexity(train, val, v) == pytest.approx(expected, rel=1e-12)


def test_dtype_choice():
    assert dtype_for(65536, "auto") == "uint16" and dtype_for(65537, "auto") == "uint32"
    assert dtype_for(65536, "uint16") == "uint16"
    with pytest.raises(ConfigError, match="--dtype.*65537 tokens does not fit uint16"):
        dtype_for(65537, "uint16")


def test_existing_tokenizer_is_copied_and_used(corpus):
    prepare(opts(corpus, out=corpus / "first"))
    meta = prepare(opts(corpus, train_bpe=None, tokenizer=corpus / "first" / "tokenizer", out=corpus / "second",
                        dtype="uint32"))
    assert meta["tokenizer_source"] == str(corpus / "first" / "tokenizer") and meta["dtype"] == "uint32"
    first = np.fromfile(corpus / "first" / "train.bin", dtype=np.uint16)
    second = np.fromfile(corpus / "second" / "train.bin", dtype=np.uint32)
    assert np.array_equal(first.astype(np.uint32), second)
    assert (corpus / "second" / "tokenizer" / "tokenizer.json").read_bytes() == \
        (corpus / "first" / "tokenizer" / "tokenizer.json").read_bytes()


def test_transformers_loads_the_tokenizer(corpus):
    transformers = pytest.importorskip("transformers")
    prepare(opts(corpus))
    tok = transformers.AutoTokenizer.from_pretrained(str(corpus / "out" / "tokenizer"))
    text = "The lazy dog watches seven owls.\n"
    assert tok.decode(tok(text).input_ids) == text
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0
    from tokenizers import Tokenizer

    assert tok(text).input_ids == Tokenizer.from_file(str(corpus / "out/tokenizer/tokenizer.json")).encode(text).ids


def test_train_reads_a_prepared_directory(corpus):
    prepare(opts(corpus))
    cfg = DataConfig(source="tokens", path=str(corpus / "out"), token_dtype="uint32", seq_len=16, batch_size=2,
                     num_workers=0)
    spec = type("S", (), {"kind": "tokens", "shape": (16,), "vocab_size": 320, "num_classes": None})()
    train = build_data(cfg, spec, device="cpu", seed=0)
    val = build_data(cfg, spec, device="cpu", seed=0, split="eval")
    meta = read_prepared(corpus / "out")
    x, y = next(iter(val))
    tokens = np.fromfile(meta.val_path, dtype=np.uint16)  # the meta's dtype, not data.token_dtype
    assert x[0].tolist() == tokens[:16].tolist() and y[0].tolist() == tokens[1:17].tolist()
    assert train.batches_per_epoch == (meta.meta["splits"]["train"]["tokens"] - 1) // 16 // 2
    small = type("S", (), {"kind": "tokens", "shape": (16,), "vocab_size": 256, "num_classes": None})()
    with pytest.raises(ConfigError, match=r"vocabulary has 256 tokens but data.path=.* was tokenized with 320: set "
                                          r"model.kwargs.vocab_size=320"):
        build_data(cfg, small, device="cpu", seed=0)


def test_prepared_directory_without_val_has_no_eval(corpus):
    prepare(opts(corpus, val_fraction=0.0))
    cfg = DataConfig(source="tokens", path=str(corpus / "out"), seq_len=16, batch_size=2, num_workers=0)
    assert build_data(cfg, None, device="cpu", seed=0, split="eval") is None


def test_a_failure_leaves_nothing_behind(corpus, monkeypatch):
    import kiln.data.prepare as mod

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(mod, "_split", boom)
    with pytest.raises(KeyboardInterrupt):
        prepare(opts(corpus))
    assert sorted(p.name for p in corpus.iterdir()) == ["a.txt", "b.jsonl"]


def test_too_little_text_for_validation(tmp_path):
    (tmp_path / "t.txt").write_text("Hi.\n")
    with pytest.raises(RuntimeError, match="too few to hold out"):
        prepare(PrepareOptions(inputs=[str(tmp_path / "t.txt")], out=tmp_path / "out", train_bpe=260,
                               val_fraction=0.01))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]
