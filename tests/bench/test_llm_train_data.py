"""The bench's corpus: one tokenizer of exactly the model's vocabulary, a learnable language written
as text, its token stream (checked against the ids written), and batches cut as torchtitan cuts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kiln.bench.train_llm import llm_train_data as data

LLAMA3 = data.Vocab(128256, 128000, 128001)


def test_llama3_vocabulary_keeps_the_special_tail_out_of_the_language():
    assert LLAMA3.reserved_from == 128000
    ids = LLAMA3.regular_ids
    assert ids[0] == 0 and ids[-1] == 127999 and ids.size == 128000
    assert LLAMA3.entry(128000) == data.BOS_TEXT and LLAMA3.entry(128001) == data.EOS_TEXT
    assert LLAMA3.entry(128002) == "<|reserved_special_token_2|>"
    small = data.Vocab(512, 1, 2)  # specials low: no tail, every other id is a word
    assert small.reserved_from == 512 and small.regular_ids.size == 510
    assert 1 not in small.regular_ids and 2 not in small.regular_ids
    with pytest.raises(ValueError):
        data.Vocab(100, 5, 5)


def test_tokenizer_has_exactly_the_vocabulary_size_and_the_special_ids(tmp_path):
    from tokenizers import Tokenizer

    vocab = data.Vocab(1000, 998, 999)
    data.write_tokenizer(tmp_path, vocab)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() == 1000
    assert tok.token_to_id(data.BOS_TEXT) == 998 and tok.token_to_id(data.EOS_TEXT) == 999
    assert tok.encode("w5 w0 w997").ids == [5, 0, 997]
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["bos_token"] == data.BOS_TEXT and config["eos_token"] == data.EOS_TEXT


def test_language_is_seeded_and_uses_regular_ids_only():
    vocab = data.Vocab(300, 298, 299)
    a, b = data.language_ids(5000, vocab, seed=3), data.language_ids(5000, vocab, seed=3)
    assert np.array_equal(a, b) and a.size == 5000
    assert not np.array_equal(a, data.language_ids(5000, vocab, seed=4))
    assert set(np.unique(a)) <= set(vocab.regular_ids.tolist())
    # Within a phrase each word is followed by one of SUCCESSORS words: bigrams are far from uniform.
    pairs = {(int(x), int(y)) for x, y in zip(a[:-1], a[1:], strict=True)}
    assert len(pairs) < 0.5 * a.size


def test_corpus_stream_is_bos_words_eos_per_document_and_batches_cut_in_order(tmp_path):
    vocab = data.Vocab(600, 1, 2)
    corpus = data.build_corpus(tmp_path, vocab, min_tokens=data.stream_tokens_needed(3, 2, 50), seed=0)
    stream = data.load_stream(corpus.tokens_path)
    assert stream.dtype == np.uint32 and stream.size == corpus.n_tokens >= 3 * 2 * 51
    lines = (corpus.dataset_dir / "data.jsonl").read_text().splitlines()
    first = json.loads(lines[0])["text"].split()
    assert stream[0] == 1 and [f"w{i}" for i in stream[1:1 + len(first)]] == first
    assert stream[1 + len(first)] == 2  # EOS closes the first document
    assert len(lines) == corpus.documents
    batches = data.batches(stream, steps=3, batch=2, seq_len=50)
    assert len(batches) == 3
    x, y = batches[1]
    assert x.shape == y.shape == (2, 50)
    # Batch 1, row 1 is sequence 3: tokens [3*51, 4*51), inputs its first 50, targets its last 50.
    assert x[1].tolist() == stream[153:203].tolist() and y[1].tolist() == stream[154:204].tolist()
    with pytest.raises(ValueError, match="token stream holds"):
        data.batches(stream, steps=1000, batch=2, seq_len=50)
