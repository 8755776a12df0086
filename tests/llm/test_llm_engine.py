"""The generation engine on CPU: stop tokens, the max-length guard, sampling, compiled variants."""

from __future__ import annotations

import contextlib

import pytest
import torch

from kiln.errors import ConfigError
from kiln.llm import Engine, Sampling, bucket_length, build_decoder, resolve_model
from kiln.llm.engine import MAX_STOP_TOKENS, check_lengths
from kiln.llm.weights import empty_decoder


@pytest.fixture(scope="module")
def model(checkpoints):
    return build_decoder(resolve_model(str(checkpoints["llama3-tied"])), device="cpu", dtype=torch.float32)


PROMPTS = [[1, 17, 33, 8, 54], [1, 40, 41]]


def test_bucket_lengths():
    assert [bucket_length(n) for n in (1, 16, 17, 100, 1024, 1025, 1600)] == [16, 16, 32, 128, 1024, 1536, 2048]


def test_generation_stops_at_a_stop_token(model):
    engine = Engine(model, stop_check_interval=2)
    free = engine.generate(PROMPTS, max_new_tokens=12)
    stop = free.tokens[0][3]  # the 4th token row 0 produces when nothing stops it
    out = engine.generate(PROMPTS, max_new_tokens=12, stop_tokens=[stop])
    cut = free.tokens[0].index(stop)
    assert out.tokens[0] == free.tokens[0][: cut + 1] and out.finish[0] == "stop"
    row1 = free.tokens[1]
    if stop in row1:
        assert out.tokens[1] == row1[: row1.index(stop) + 1] and out.finish[1] == "stop"
    else:
        assert out.tokens[1] == row1 and out.finish[1] == "length"


def test_all_rows_stopped_ends_decoding_early(model):
    engine = Engine(model, stop_check_interval=1)
    free = engine.generate([PROMPTS[0]], max_new_tokens=12)
    out = engine.generate([PROMPTS[0]], max_new_tokens=12, stop_tokens=[free.tokens[0][2]])
    assert out.finish == ["stop"] and out.steps < 11
    first = engine.generate([PROMPTS[0]], max_new_tokens=12, stop_tokens=[free.tokens[0][0]])
    assert first.tokens == [[free.tokens[0][0]]] and first.steps == 0  # stopped by the prefill's token


@pytest.mark.parametrize(("kwargs", "key", "needle"), [
    ({"max_new_tokens": 300}, "max_new_tokens", "256 positions"),
    ({"max_new_tokens": 8, "max_seq_len": 10}, "max_seq_len", "10 cache slots"),
    ({"max_new_tokens": 0}, "max_new_tokens", ">= 1"),
    ({"max_new_tokens": 4, "stop_tokens": list(range(MAX_STOP_TOKENS + 1))}, "stop_tokens", "at most"),
    ({"max_new_tokens": 4, "sampling": Sampling(temperature=-1.0)}, "temperature", ">= 0"),
    ({"max_new_tokens": 4, "sampling": Sampling(temperature=1.0, top_p=0.0)}, "top_p", "(0, 1]"),
])
def test_bad_requests_raise_config_errors_before_any_work(model, kwargs, key, needle):
    engine = Engine(model)
    with pytest.raises(ConfigError) as info:
        engine.generate(PROMPTS, **kwargs)
    assert info.value.key == key and needle in str(info.value)
    assert engine.slots is None


def test_length_guard_names_the_callers_flags():
    with pytest.raises(ConfigError) as info:
        check_lengths([200], 100, max_positions=256, max_seq_len=None, keys={"max_new_tokens": "--new-tokens"})
    assert info.value.key == "--new-tokens" and "at most 56 new tokens fit" in str(info.value)
    with pytest.raises(ConfigError) as info:  # the prompt alone fills the positions: the prompt's flag
        check_lengths([256], 4, max_positions=256, max_seq_len=None,
                      keys={"max_new_tokens": "--new-tokens", "prompt": "--prompt-len"})
    assert info.value.key == "--prompt-len" and "at most 255 tokens" in str(info.value)
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        Engine(empty_decoder(resolve_model("llama-3.2-1b").config, device="meta", dtype=torch.float32)).prepare(
            [[999_999]], max_new_tokens=1)


def test_sampling_limits_and_seeds(model):
    engine = Engine(model)
    greedy = engine.generate(PROMPTS, max_new_tokens=10).tokens
    # top-k 1 and a tiny nucleus leave only the argmax, whatever the temperature.
    assert engine.generate(PROMPTS, max_new_tokens=10, sampling=Sampling(2.0, top_k=1), seed=0).tokens == greedy
    assert engine.generate(PROMPTS, max_new_tokens=10, sampling=Sampling(2.0, top_p=1e-6), seed=0).tokens == greedy
    hot = Sampling(temperature=5.0)
    a = engine.generate(PROMPTS, max_new_tokens=10, sampling=hot, seed=123).tokens
    assert engine.generate(PROMPTS, max_new_tokens=10, sampling=hot, seed=123).tokens == a
    assert engine.generate(PROMPTS, max_new_tokens=10, sampling=hot, seed=124).tokens != a


@pytest.mark.parametrize("vocab", [100, 4096, 128256, 5000])  # below the chunked size, exact, 128k, ragged
def test_chunked_argmax_is_argmax_ties_to_the_lowest_index(vocab):
    from kiln.llm.sampling import argmax

    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(vocab))
    logits[1, vocab // 3] = logits[1, vocab - 1] = 50.0  # a tie across chunks: the first wins
    logits[2] = 0.0  # all equal: index 0
    assert torch.equal(argmax(logits), logits.argmax(dim=-1))
    assert argmax(logits)[1] == vocab // 3 and argmax(logits)[2] == 0
    compiled = torch.compile(argmax, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(logits), logits.argmax(dim=-1))


def test_top_k_samples_only_among_the_k_most_likely():
    from kiln.llm.sampling import sample

    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0, 4.5]]).repeat(2000, 1)
    drawn = sample(logits, False, torch.tensor(1.0), torch.tensor(2), torch.tensor(1.0))
    assert set(drawn.tolist()) == {1, 4}
    share = (drawn == 1).float().mean().item()
    expected = 1 / (1 + torch.exp(torch.tensor(-0.5))).item()
    assert abs(share - expected) < 0.05  # exponential race = multinomial over the kept tokens


def test_compiled_engine_matches_eager_and_counts_its_compiles(model):
    """inductor (CPU) for prefill and decode: same greedy tokens as eager; a prompt in the same
    bucket reuses the compiled variants, a longer one compiles one more prefill."""
    eager = Engine(model).generate(PROMPTS, max_new_tokens=6).tokens
    engine = Engine(model, compile=True)
    assert engine.generate(PROMPTS, max_new_tokens=6).tokens == eager
    assert sorted(engine.compiled) == ["decode[b2,cap22,greedy]", "prefill[b2,len16,cap22,pad,greedy]"]
    # each first call compiled its graph or loaded it from inductor's cache (an earlier run's)
    assert set(engine.graph_cache) == set(engine.compiled) and all(n["from_cache"] + n["compiled"] >= 1
                                                                   for n in engine.graph_cache.values())
    # dynamo traced each variant and inductor compiled or loaded it: both timed (torch's compile timers)
    assert all(n["trace_ms"] > 0 and n["inductor_ms"] > 0 for n in engine.graph_cache.values())
    engine.generate([[1, 2, 3, 4], [1, 5, 6]], max_new_tokens=6)
    assert len(engine.compiled) == 2
    longer = [list(range(1, 20)), [1, 2]]
    assert engine.generate(longer, max_new_tokens=3, max_seq_len=22).tokens == \
        Engine(model).generate(longer, max_new_tokens=3, max_seq_len=22).tokens
    assert len(engine.compiled) == 3 and any("len19" in name for name in engine.compiled)


def test_blocks_scope_compiles_one_block_for_every_layer_and_matches_eager(model):
    """`compile_scope="blocks"`: the layers share one compiled block per shape (prefill, decode), the
    greedy tokens equal eager's, and the model is left as it was."""
    from torch._dynamo.utils import counters

    assert len(model.layers) >= 2
    eager = Engine(model).generate(PROMPTS, max_new_tokens=6).tokens
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    engine = Engine(model, compile=True, compile_scope="blocks")
    assert engine.generate(PROMPTS, max_new_tokens=6).tokens == eager
    assert counters["stats"]["unique_graphs"] - before == 2  # one block graph for prefill, one for decode
    assert sorted(engine.compiled) == ["decode[b2,cap22,greedy]", "prefill[b2,len16,cap22,pad,greedy]"]
    assert all("forward" not in layer.__dict__ for layer in model.layers)
    assert Engine(model).generate(PROMPTS, max_new_tokens=6).tokens == eager
    with pytest.raises(ConfigError, match="compile_scope"):
        Engine(model, compile=True, compile_scope="layers")


def test_edges_compile_without_the_blocks_tuning_unless_asked(monkeypatch):
    """The step's edges take the blocks' inductor options less coordinate-descent tuning (EDGE_TUNING
    off): their few small kernels are not worth a tuning pass in every warm-up."""
    from kiln.llm import block_compile

    seen = []
    monkeypatch.setattr(block_compile.torch, "compile", lambda fn, **kw: seen.append(kw["options"]) or fn)
    options = {"coordinate_descent_tuning": True, "max_autotune": False}
    block_compile.compiled_edge(len, options)
    block_compile.compiled_edge(len, {"coordinate_descent_tuning": True})
    monkeypatch.setattr(block_compile, "EDGE_TUNING", True)
    block_compile.compiled_edge(len, options)
    assert seen == [{"max_autotune": False}, None, options]


@pytest.mark.parametrize("shape", [(3, 16384), (1, 128256), (2, 129), (4, 128), (2, 7)])
def test_cumsum_short_scans_equals_cumsum(shape):
    from kiln.llm.sampling import cumsum_short_scans

    x = torch.rand(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(cumsum_short_scans(x), x.cumsum(dim=-1), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("family", ["llama3-tied", "mistral"])  # mistral: a sliding window shorter than the prompts
def test_batched_greedy_equals_each_prompt_decoded_alone(checkpoints, family):
    """Prompts of different lengths in one left-padded batch generate, greedy, exactly the tokens
    each generates alone (each alone has its own padding: none, or up to its own bucket)."""
    model = build_decoder(resolve_model(str(checkpoints[family])), device="cpu", dtype=torch.float32)
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 96, (n,), generator=gen).tolist() for n in (3, 9, 17, 5)]
    engine = Engine(model)
    batched = engine.generate(prompts, max_new_tokens=10)
    alone = [engine.generate([p], max_new_tokens=10).tokens[0] for p in prompts]
    assert batched.tokens == alone
    assert batched.padded_len == 32 and batched.prompt_lens == [3, 9, 17, 5]


def test_warmup_reasons_say_per_variant_what_the_first_call_did():
    from kiln.llm.engine import warmup_reasons

    compiled = {"prefill[b1,len16,cap26,greedy]": 1.54, "decode[b1,cap26,greedy]": 2.25, "decode[b2,cap26,greedy]": 0.5}
    cache = {"prefill[b1,len16,cap26,greedy]": {"from_cache": 2, "compiled": 1},
             "decode[b1,cap26,greedy]": {"from_cache": 0, "compiled": 1, "kernels_compiled": 3,
                                         "kernel_compile_ms": 1930, "kernels_from_cache": 0}}
    assert warmup_reasons(compiled, cache) == ("prefill 1.5 s (1 graph compiled, 2 graphs from the compile cache), "
                                               "decode 2.2 s (1 graph compiled; 3 Triton kernels compiled in 1.9 s), "
                                               "decode 0.5 s")


class _FakeCuda:
    """torch.cuda's graph calls, recorded on the CPU (the warm-up's side stream is a CUDA device's
    only): a capture runs its body (a real capture runs nothing) while `capturing` is set; a replay
    only counts."""

    def __init__(self):
        self.capturing, self.pools, self.graphs = False, [], []
        fake = self

        class Graph:
            def __init__(self):
                self.replays = 0
                fake.graphs.append(self)

            def replay(self):
                self.replays += 1

        @contextlib.contextmanager
        def graph(g, pool=None):
            fake.pools.append(pool)
            fake.capturing = True
            try:
                yield
            finally:
                fake.capturing = False

        self.patches = {"CUDAGraph": Graph, "graph": graph, "graph_pool_handle": lambda: ("pool",)}


def test_a_warmed_prefill_variant_is_captured_once_and_replayed(model, monkeypatch):
    """With CUDA graphs a prefill variant runs as compiled on its first call, runs and is captured
    (in the prefill pool) on its GRAPH_WARMUP_STEPS-th, and is replayed after, with no forward;
    the decode step takes the same warm-then-capture path. Prefills over PREFILL_GRAPH_TOKENS, with
    PREFILL_GRAPHS off, or eager (compile_prefill False) are never captured; new slots drop the graphs."""
    fake = _FakeCuda()
    for name, value in fake.patches.items():
        monkeypatch.setattr(torch.cuda, name, value, raising=False)
    calls = []
    hook = model.register_forward_hook(lambda *a: calls.append(fake.capturing))
    try:
        _check_prefill_graphs(model, monkeypatch, fake, calls)
    finally:
        hook.remove()


def _check_prefill_graphs(model, monkeypatch, fake: _FakeCuda, calls: list[bool]) -> None:
    import kiln.llm.engine as eng

    def run(engine, new_tokens=1, prompts=PROMPTS):
        calls.clear()
        return engine.generate(prompts, max_new_tokens=new_tokens, max_seq_len=32).tokens

    def graphed(**settings):  # a CPU engine as a compiled CUDA one would be, without compiling
        engine = Engine(model)
        engine.cuda_graphs, engine.compile_prefill = True, True
        for name, value in settings.items():
            setattr(engine, name, value)
        return engine

    reference = run(Engine(model))
    engine = graphed()
    assert run(engine) == reference and calls == [False] and not engine._prefill_graphs
    assert run(engine) == reference and calls == [False, True] and fake.pools == [("pool",)]
    (graph,) = engine._prefill_graphs.values()
    run(engine)
    assert calls == [] and graph.replays == 1
    run(engine, new_tokens=4)  # the prefill replays; decode: warm, warm + capture, replay
    assert graph.replays == 2 and calls == [False, False, True] and fake.pools[-1] is None
    assert engine._graphs[True].replays == 1
    run(engine, prompts=[PROMPTS[0]])  # other slots: the graphs point at the old buffers
    assert not engine._prefill_graphs and not engine._graphs
    for setting, value in (("PREFILL_GRAPH_TOKENS", 2 * 16 - 1), ("PREFILL_GRAPHS", False), ("compile_prefill", False)):
        with monkeypatch.context() as m:
            if hasattr(eng, setting):
                m.setattr(eng, setting, value)
            off = graphed(**({} if hasattr(eng, setting) else {setting: value}))
            assert [run(off) for _ in range(3)] == [reference] * 3 and not off._prefill_graphs
