"""Warm-up before the server binds: every decode batch bucket and prompt bucket variant is run
once (compiled where compiling is on), the rows are left as new, and requests after it are exact."""

from __future__ import annotations

import itertools

import pytest

from kiln.errors import ConfigError
from kiln.llm import Engine
from kiln.serve.metrics import ServeMetrics
from kiln.serve.rows import Rows, RowSettings
from kiln.serve.warmup import chosen_prompt_buckets, prompt_buckets, warm_up

pytest.importorskip("transformers")




def test_prompt_buckets_reach_the_longest_prompt_a_row_holds():
    assert prompt_buckets(1024) == [16, 32, 64, 128, 256, 512, 1024]
    assert prompt_buckets(1025) == [16, 32, 64, 128, 256, 512, 1024]  # a 1024-token prompt + 1 new token
    assert prompt_buckets(2048) == [16, 32, 64, 128, 256, 512, 1024, 1536, 2048]
    assert prompt_buckets(40) == [16, 32, 64] and prompt_buckets(2) == [16]
    assert chosen_prompt_buckets(1024, []) == prompt_buckets(1024)
    assert chosen_prompt_buckets(1024, [512, 16, 512]) == [16, 512]
    with pytest.raises(ConfigError, match="--warmup-prompt-buckets") as err:
        chosen_prompt_buckets(1024, [16, 2048])
    assert "2048" in str(err.value) and "1024" in str(err.value)


def test_each_warm_up_line_says_what_its_variant_loaded_from_the_compile_cache(model):
    """A variant whose graph came from inductor's cache says so (the counter inductor bumps on a hit)."""
    from torch._dynamo.utils import counters

    rows = Rows(model, rows=1, capacity=40, compile=False, cuda_graphs=False)
    real_decode = rows._decode

    def decode(m, view, greedy):
        if greedy:
            counters["inductor"]["fxgraph_cache_hit"] += 1
        return real_decode(m, view, greedy)

    rows._decode = decode
    lines: list[str] = []
    ticks = itertools.count()
    warm_up(rows, [16], lines.append, clock=lambda: float(next(ticks)))
    assert lines[:2] == ["kiln: warmed decode batch 1 (greedy) in 1.0 s (1 graph from the compile cache)",
                         "kiln: warmed decode batch 1 (sampling) in 1.0 s"]


def test_warm_up_runs_every_variant_once_and_leaves_the_rows_new(model):
    # batch buckets 1, 2, 3; a budget of 32 prompt tokens prefills two 16-token prompts together
    rows = Rows(model, rows=3, capacity=40, compile=False, cuda_graphs=False, prefill_tokens=32, join_batch=2)
    prefills, decodes = [], []
    real_prefill, real_decode = rows.prefill.fn, rows._decode
    rows.prefill.fn = lambda m, tokens, pad, *rest: (prefills.append((*tokens.shape, pad is None)),
                                                     real_prefill(m, tokens, pad, *rest))[1]
    rows._decode = lambda m, view, greedy: (decodes.append((view.tokens.shape[0], greedy)),
                                            real_decode(m, view, greedy))[1]
    lines: list[str] = []
    ticks = itertools.count()
    total = warm_up(rows, [16, 64], lines.append, clock=lambda: float(next(ticks)))
    assert decodes == [(1, True), (1, False), (2, True), (2, False), (3, True), (3, False)]
    # 64 >= capacity 40: no prompt fills bucket 64 and leaves a slot, so only its padded variant.
    assert prefills == [(1, 16, True), (1, 16, False), (2, 16, True), (2, 16, False), (1, 64, False)]
    assert total == 11.0  # one clock tick per variant
    assert lines[0] == "kiln: warmed decode batch 1 (greedy) in 1.0 s"
    assert lines[6] == "kiln: warmed prefill 16-token prompt (bucket 16) in 1.0 s"
    assert lines[8] == "kiln: warmed prefill 2 x 16-token prompt (bucket 16) in 1.0 s"
    assert lines[-1] == "kiln: warm-up done in 11.0 s (6 decode and 5 prefill variants)"
    assert rows.cursor == 0 and int(rows.buf.pos) == 0 and not rows.busy
    assert not rows.buf.tokens.any() and not rows.buf.pad.any()
    rows.prefill.fn, rows._decode = real_prefill, real_decode
    prompt = [1, 17, 33, 8, 54]
    assert rows.place(len(prompt), 6)
    got = [rows.join(0, prompt, 6, RowSettings())]
    got += [rows.step()[0] for _ in range(5)]
    assert got == Engine(model).generate([prompt], max_new_tokens=6).tokens[0]


def test_warm_up_refuses_busy_rows(model):
    rows = Rows(model, rows=1, capacity=32, compile=False, cuda_graphs=False)
    assert rows.place(3, 4)
    rows.join(0, [1, 2, 3], 4, RowSettings())
    with pytest.raises(RuntimeError, match="busy"):
        rows.warm_decode(1, True)


def test_the_warm_up_gauge():
    metrics = ServeMetrics("m")
    assert "kiln_serve_warmup_seconds 0.0\n" in metrics.text()
    metrics.warmed(12.5)
    assert "kiln_serve_warmup_seconds 12.5\n" in metrics.text()
