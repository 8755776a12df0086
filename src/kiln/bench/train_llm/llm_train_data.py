"""The tokens every row of `kiln bench train-llm` trains on: one corpus, one tokenizer, one order.

Peers read text through their own tokenizer (torchtitan: `tokenizer.json` under
`model.hf_assets_path`, documents from a local dataset directory), so the bench writes both and
tokenizes the same text for kiln's rows:
- a word-level `tokenizer.json` (Hugging Face `tokenizers`) of exactly `vocab_size` entries, so
  every row's model has the same vocabulary (Llama 3's 128,256 by default) with BOS/EOS at the
  model's ids;
- a learnable synthetic language written as text (`data.jsonl`, one `{"text": ...}` document a
  line): phrases that start at a Zipf-distributed word and continue through one of a few fixed
  successors per word, so the loss falls measurably within tens of steps;
- `tokens.bin` (uint32): the documents tokenized with that tokenizer, each as BOS + words + EOS,
  concatenated, the stream torchtitan's text dataset builds.
Batches cut the stream as that dataset does: sequence j is tokens [j(T+1), (j+1)(T+1)), inputs
its first T tokens and targets its last T, and batch i holds sequences iB .. iB+B-1.

With N ranks the corpus is N shards of the same number of documents, written one after another
(rank r's shard is what torchtitan's `split_dataset_by_node` gives rank r of a map-style dataset:
a contiguous 1/N of the documents); each shard is its own stream, cut as above into per-rank
batches of B sequences, and the bench's global batch i is rank 0's batch i, then rank 1's, ...
(global batch = N x B). One shard is the single-GPU corpus.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

BOS_TEXT = "<|begin_of_text|>"
EOS_TEXT = "<|end_of_text|>"
# Words per phrase of the synthetic language, successors per word, and the Zipf exponent of
# phrase-initial words: small enough that tens of steps learn something, large enough not to be trivial.
PHRASE = 8
SUCCESSORS = 4
ZIPF_A = 1.2
DOC_WORDS = (400, 3000)


def word(i: int) -> str:
    """The vocabulary entry of regular token id `i`."""
    return f"w{i}"


@dataclass(frozen=True)
class Vocab:
    size: int
    bos_id: int
    eos_id: int

    def __post_init__(self) -> None:
        if not (0 <= self.bos_id < self.size and 0 <= self.eos_id < self.size and self.bos_id != self.eos_id):
            raise ValueError(f"bos {self.bos_id} and eos {self.eos_id} must be distinct ids below {self.size}")

    @property
    def specials(self) -> dict[int, str]:
        return {self.bos_id: BOS_TEXT, self.eos_id: EOS_TEXT}

    @property
    def reserved_from(self) -> int:
        """First id of the special-token tail when BOS/EOS sit in the upper half of the vocabulary
        (Llama 3 keeps every id from BOS up for special tokens), else the size (no tail)."""
        low = min(self.bos_id, self.eos_id)
        return low if low >= self.size // 2 else self.size

    @property
    def regular_ids(self) -> np.ndarray:
        """Ids the language draws from: all but BOS, EOS and the special-token tail."""
        ids = np.arange(self.reserved_from, dtype=np.int64)
        return ids[(ids != self.bos_id) & (ids != self.eos_id)]

    def entry(self, i: int) -> str:
        if i in self.specials:
            return self.specials[i]
        if i >= self.reserved_from:
            return f"<|reserved_special_token_{i - self.reserved_from}|>"
        return word(i)


def write_tokenizer(directory: Path, vocab: Vocab) -> Path:
    """`tokenizer.json` (word level, whitespace split) and `tokenizer_config.json` naming BOS/EOS,
    loadable by `tokenizers`, transformers' AutoTokenizer and torchtitan's HuggingFaceTokenizer."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel

    directory.mkdir(parents=True, exist_ok=True)
    entries = {vocab.entry(i): i for i in range(vocab.size)}
    # WordLevel needs an unknown token; the text never holds one. The last non-special id serves.
    unk = vocab.entry(max(i for i in (vocab.size - 1, vocab.size - 2, vocab.size - 3) if i not in vocab.specials))
    tok = Tokenizer(WordLevel(entries, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": BOS_TEXT, "eos_token": EOS_TEXT, "unk_token": unk, "add_bos_token": False,
              "add_eos_token": False, "model_max_length": 1 << 20, "tokenizer_class": "PreTrainedTokenizerFast"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    return directory / "tokenizer.json"


def language_ids(n_tokens: int, vocab: Vocab, seed: int) -> np.ndarray:
    """`n_tokens` ids of the synthetic language (phrases of PHRASE words: a Zipf-drawn start, then
    each word one of its SUCCESSORS fixed successors)."""
    rng = np.random.default_rng(seed)
    ids = rng.permutation(vocab.regular_ids)  # which ids are frequent: random, not the smallest
    n = len(ids)
    successors = rng.integers(0, n, size=(n, SUCCESSORS))
    phrases = -(-n_tokens // PHRASE)
    rank = rng.zipf(ZIPF_A, size=phrases) - 1
    current = np.where(rank < n, rank, rng.integers(0, n, size=phrases))
    out = np.empty((phrases, PHRASE), dtype=np.int64)
    for k in range(PHRASE):
        out[:, k] = current
        current = successors[current, rng.integers(0, SUCCESSORS, size=phrases)]
    return ids[out.reshape(-1)[:n_tokens]]


def documents(n_tokens: int, vocab: Vocab, seed: int) -> list[np.ndarray]:
    """The language cut into documents of DOC_WORDS words (the last one shorter)."""
    ids = language_ids(n_tokens, vocab, seed)
    rng = np.random.default_rng(seed + 1)
    docs, start = [], 0
    while start < len(ids):
        length = int(rng.integers(*DOC_WORDS))
        docs.append(ids[start:start + length])
        start += length
    return docs


def stream_tokens_needed(steps: int, batch: int, seq_len: int) -> int:
    """Tokens of the stream that `steps` batches of `batch` sequences of `seq_len` consume."""
    return steps * batch * (seq_len + 1)


@dataclass(frozen=True)
class Corpus:
    directory: Path
    tokenizer_dir: Path
    dataset_dir: Path
    """Directory holding `data.jsonl` (the text, one document a line)."""
    tokens_path: Path
    """uint32 token stream: BOS + words + EOS per document, the documents in order."""
    vocab: Vocab
    n_tokens: int
    documents: int
    shard_tokens: tuple[int, ...] = ()
    """Stream tokens of each rank's shard, in the order tokens.bin holds them (empty: one shard)."""


def _shard_documents(words: int, vocab: Vocab, seed: int, shards: int, min_tokens: int) -> list[list[np.ndarray]]:
    """`shards` lists of the same number of documents (shard r drawn with seed + r), each holding at
    least `min_tokens` stream tokens (BOS and EOS included)."""
    while True:
        per = [documents(words, vocab, seed + r) for r in range(shards)]
        count = min(len(docs) for docs in per)
        per = [docs[:count] for docs in per]
        if all(sum(len(d) + 2 for d in docs) >= min_tokens for docs in per):
            return per
        words *= 2


def build_corpus(directory: Path, vocab: Vocab, *, min_tokens: int, seed: int, shards: int = 1) -> Corpus:
    """Write the tokenizer, the text and its token stream under `directory`: at least `min_tokens`
    stream tokens per shard (one shard per rank). The stream comes from tokenizing the text (the
    path a user's data takes) and is checked against the ids the text was written from."""
    from tokenizers import Tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer_dir, dataset_dir = directory / "tokenizer", directory / "text"
    write_tokenizer(tokenizer_dir, vocab)
    dataset_dir.mkdir(parents=True, exist_ok=True)
    # Documents add BOS and EOS: draw enough words that the stream holds min_tokens.
    words = min_tokens + 2 * (min_tokens // DOC_WORDS[0] + 1)
    per_shard = [documents(words, vocab, seed)] if shards == 1 else _shard_documents(words, vocab, seed, shards,
                                                                                      min_tokens)
    docs = [doc for shard in per_shard for doc in shard]
    texts = [" ".join(word(int(i)) for i in doc) for doc in docs]
    with open(dataset_dir / "data.jsonl", "w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    parts = []
    for doc, encoding in zip(docs, tokenizer.encode_batch(texts), strict=True):
        got = np.asarray(encoding.ids, dtype=np.int64)
        if not np.array_equal(got, doc):
            raise RuntimeError("the tokenizer does not give back the ids the text was written from")
        parts.append(np.concatenate([[vocab.bos_id], got, [vocab.eos_id]]))
    stream = np.concatenate(parts).astype(np.uint32)
    tokens_path = directory / "tokens.bin"
    stream.tofile(tokens_path)
    shard_tokens = () if shards == 1 else tuple(sum(len(d) + 2 for d in shard) for shard in per_shard)
    return Corpus(directory, tokenizer_dir, dataset_dir, tokens_path, vocab, int(stream.size), len(docs),
                  shard_tokens)


def load_stream(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype=np.uint32)


def _cut(stream: np.ndarray, steps: int, batch: int, seq_len: int) -> torch.Tensor:
    """[steps, batch, seq_len + 1] sequences cut from the start of one stream."""
    need = stream_tokens_needed(steps, batch, seq_len)
    if stream.size < need:
        raise ValueError(f"the token stream holds {stream.size} tokens, {steps} batches need {need}")
    return torch.from_numpy(stream[:need].astype(np.int64)).view(steps, batch, seq_len + 1)


def batches(stream: np.ndarray, *, steps: int, batch: int, seq_len: int, device: torch.device | str = "cpu",
            shard_tokens: tuple[int, ...] = ()) -> list[tuple[Tensor, Tensor]]:
    """`steps` global (inputs, targets) batches of [shards x batch, seq_len] int64, cut as described
    above: rows r*batch .. (r+1)*batch-1 are rank r's local batch (`shard_tokens`: the stream's shards)."""
    bounds = np.cumsum((0, *shard_tokens)) if shard_tokens else np.array([0, stream.size])
    seqs = torch.cat([_cut(stream[a:b], steps, batch, seq_len) for a, b in zip(bounds[:-1], bounds[1:])], dim=1)
    return [(s[:, :-1].contiguous().to(device), s[:, 1:].contiguous().to(device)) for s in seqs]


def rank_sample_order(global_batches: list[tuple[Tensor, Tensor]], nproc: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) [samples, seq_len] int64 arrays laid out so that a map-style dataset read
    by `DistributedSampler(num_replicas=nproc, rank=r, shuffle=False)` in local batches of B gives
    rank r exactly its rows of each global batch: sample N(kB + t) + r is rank r's sequence t of
    batch k (the sampler hands rank r the indices r, r + N, r + 2N, ...)."""
    def layout(part: Tensor) -> np.ndarray:
        steps, rows, seq = part.shape
        local = rows // nproc
        return part.view(steps, nproc, local, seq).permute(0, 2, 1, 3).reshape(-1, seq).cpu().numpy()

    xs = torch.stack([x for x, _ in global_batches])
    ys = torch.stack([y for _, y in global_batches])
    return layout(xs), layout(ys)


def write_rank_files(global_batches: list[tuple[Tensor, Tensor]], nproc: int, directory: Path) -> tuple[Path, Path]:
    """inputs.npy and labels.npy of every step's global batch, in rank_sample_order's layout."""
    directory.mkdir(parents=True, exist_ok=True)
    inputs, labels = rank_sample_order(global_batches, nproc)
    paths = directory / "inputs.npy", directory / "labels.npy"
    np.save(paths[0], inputs)
    np.save(paths[1], labels)
    return paths
