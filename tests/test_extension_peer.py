"""docs/extension.md "Add a benchmark peer", followed step by step: a toy peer in a temporary package, registered in
kiln.bench.peers.table (monkeypatch undoes it), runs on CPU through the real `kiln bench
train-llm` and `kiln bench llm` and its rows land in results.json beside kiln's."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from kiln.bench.peers import table as registry
from kiln.cli.main import main
from kiln.models.hf import PRESETS

# Step 1 of the doc: one folder, a peer.py with a class of the four steps and one instance of it.
TRAIN_PEER = '''
"""A toy train-llm peer: a bigram table trained by SGD on the bench's own batches, in this process."""

import time

import torch

from kiln.bench.train_llm.llm_train_result import RowRun, TrainRow, set_figures
from kiln.bench.peers.interface import NothingPrepared
from kiln.errors import ConfigError


class ToyPeer:
    name = "toy"
    bench = "train-llm"

    def check(self, opts) -> None:
        if opts.seq_len % 4:
            raise ConfigError("--seq-len", f"the toy peer takes multiples of 4, got {opts.seq_len}")

    def prepare(self, run: RowRun) -> NothingPrepared:
        return NothingPrepared()

    def run(self, prepared, run: RowRun) -> list[TrainRow]:
        vocab = run.ctx.vocab.size
        table = torch.zeros(vocab, vocab, requires_grad=True)
        opt = torch.optim.SGD([table], lr=50.0)
        losses, seconds = [], []
        for x, y in run.batches:
            start = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(table[x].flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            seconds.append(time.perf_counter() - start)
            losses.append(float(loss.detach()))
        row = TrainRow(run.spec.name, run.spec.kind, params=table.numel(), config={"toy": "bigram"})
        set_figures(row, seconds[1:], run.ctx, run.opts.warmup)
        row.first_step_s, row.losses = seconds[0], losses
        row.loss_first, row.loss_last, row.peak_mem_bytes = losses[0], losses[-1], None
        return [row]

    def rows(self, found, run):
        return found


TOY = ToyPeer()
'''

LLM_PEER = '''
"""A toy llm peer: greedy decoding with kiln's own decoder, one token at a time, no cache."""

import time
from dataclasses import dataclass

import torch

from kiln.bench.peers.interface import NothingPrepared
from kiln.bench.typed_row import UNSET, JsonRow


@dataclass
class ToyRow(JsonRow):
    engine: str
    quant: str
    model: str
    dtype: str
    batch: int
    prompt_len: int
    new_tokens: int
    status: str = "ok"
    reason: str | None = None
    request_tok_s: float = UNSET
    label: str = UNSET


class ToyLlmPeer:
    name = "toy-llm"
    bench = "llm"

    def check(self, request) -> dict:
        return {}

    def asked(self, plan) -> bool:
        return True

    def prepare(self, ctx) -> NothingPrepared:
        return NothingPrepared()

    def run(self, prepared, ctx) -> list[ToyRow]:
        o = ctx.plan
        tokens = torch.zeros(1, o.prompt_len, dtype=torch.long, device=ctx.device)
        start = time.perf_counter()
        with torch.inference_mode():
            for _ in range(o.new_tokens):
                nxt = ctx.kiln_model(tokens)[:, -1].argmax(-1, keepdim=True)
                tokens = torch.cat([tokens, nxt], dim=1)
        seconds = time.perf_counter() - start
        return [ToyRow(self.name, "none", o.model, o.dtype, 1, o.prompt_len, o.new_tokens,
                       request_tok_s=o.new_tokens / seconds, label=self.name)]

    def rows(self, found, ctx):
        for r in ctx.bench_rows.values():
            if r.row.get("request_tok_s"):
                r.row.against_peers["request_vs_toy"] = r.row.request_tok_s / found[0].request_tok_s
        return found


TOY_LLM = ToyLlmPeer()
'''


@pytest.fixture
def toy_package(tmp_path, monkeypatch):
    """Steps 1 and 3: the package `toy_peers` on sys.path, its peers in the registry's table."""
    folder = tmp_path / "pkg" / "toy_peers"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text('"""Toy peers."""\n')
    (folder / "train_peer.py").write_text(textwrap.dedent(TRAIN_PEER))
    (folder / "llm_peer.py").write_text(textwrap.dedent(LLM_PEER))
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    from toy_peers.llm_peer import TOY_LLM
    from toy_peers.train_peer import TOY

    for peer in (TOY, TOY_LLM):
        monkeypatch.setitem(registry.PEERS, (peer.bench, peer.name), peer)
    yield
    for name in [m for m in sys.modules if m == "toy_peers" or m.startswith("toy_peers.")]:
        sys.modules.pop(name)


@pytest.fixture
def tiny_llama(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({**PRESETS["llama-tiny"], "head_dim": 16}))
    return str(path)


def _train_llm(tiny_llama, out, *extra):
    return main(["bench", "train-llm", "--model", tiny_llama, "--seq-len", "16", "--batch-size", "2",
                 "--steps", "6", "--warmup", "1", "--lr-warmup", "2", "--precision", "fp32", "--device", "cpu",
                 "--out", str(out), *extra])


def test_a_registered_train_peer_runs_as_a_row_of_bench_train_llm(toy_package, tiny_llama, tmp_path, capsys):
    out = tmp_path / "out"
    assert _train_llm(tiny_llama, out, "--rows", "toy") == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [(r["row"], r["kind"], r["status"]) for r in rows] == [("toy", "toy", "ok")]
    toy = rows[0]
    assert len(toy["losses"]) == 6 and toy["loss_last"] < toy["loss_first"]
    assert toy["timed_steps"] == 5 and toy["tokens_per_s"] > 0 and toy["config"] == {"toy": "bigram"}
    assert toy["ref"] == "toy" and toy["speedup_vs_ref"] == 1.0
    assert "| toy | toy | ok |" in (out / "results.md").read_text()
    assert "1 rows (1 ok)" in capsys.readouterr().out


def test_the_peers_check_refuses_bad_input_before_any_work(toy_package, tiny_llama, tmp_path, bad_input):
    out = tmp_path / "out"
    argv = ["bench", "train-llm", "--model", tiny_llama, "--seq-len", "18", "--steps", "6", "--warmup", "1",
            "--lr-warmup", "2", "--device", "cpu", "--rows", "toy", "--out", str(out)]
    bad_input(argv, ["--seq-len", "multiples of 4"])
    assert not out.exists()


def test_an_unregistered_peer_is_not_a_row(tiny_llama, tmp_path, bad_input):
    argv = ["bench", "train-llm", "--model", tiny_llama, "--seq-len", "16", "--steps", "6", "--warmup", "1",
            "--lr-warmup", "2", "--device", "cpu", "--rows", "toy", "--out", str(tmp_path / "out")]
    bad_input(argv, ["--rows", "'toy'"])


@pytest.mark.parametrize("engine", ["kiln-eager", "hf-eager"])  # hf-eager alone: kiln's decoder is built for the peer
def test_a_registered_llm_peer_runs_beside_kiln_in_bench_llm(toy_package, tmp_path, engine):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
        "num_attention_heads": 2, "max_position_embeddings": 64}))
    out = tmp_path / "bench"
    code = main(["bench", "llm", "--model", str(tmp_path / "model"), "--engines", engine, "--prompt-len", "8",
                 "--new-tokens", "4", "--repeats", "1", "--prefill-repeats", "1", "--device", "cpu", "--out", str(out)])
    assert code == 0
    rows = {r["engine"]: r for r in json.loads((out / "results.json").read_text())["results"]}
    assert list(rows) == [engine, "toy-llm"]
    assert rows["toy-llm"]["status"] == "ok" and rows["toy-llm"]["request_tok_s"] > 0
    assert rows[engine]["request_vs_toy"] == pytest.approx(rows[engine]["request_tok_s"] / rows["toy-llm"]["request_tok_s"])
