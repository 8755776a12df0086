"""kiln's Triton decode attention (kiln.kernels.triton_decode) on CPU through Triton's interpreter, fp32:
the kernel's chunking, its row bounds (left padding, the step's slot, sliding windows) and the
combine, against the matmul path and a direct softmax. The GPU check of the compiled kernel is
benchmarks/decode_attention_check.py.

Triton picks its interpreter from TRITON_INTERPRET when it is first imported, which torch._dynamo
does early; so the kernel tests run in a subprocess started with it set (`test_under_interpreter`)."""

from __future__ import annotations

import copy

import pytest
import torch

from kiln.errors import ConfigError
from kiln.kernels.triton_launch import arrival_counters
from kiln.llm import Engine, build_decoder, resolve_model
from kiln.llm import decode_attention as da
from kiln.llm.kernels import use_decode_kernels
from kiln.llm.model import KVCache

from ..benchmark_scripts import load_script
from ..llm.conftest import assert_decode_matches_matmul, transformers  # noqa: F401  (transformers: skips without it)
from .triton_interpreter import interpreted, not_in_subprocess, rerun_interpreted

td = pytest.importorskip("kiln.kernels.triton_decode", reason="Triton is not installed (pip install 'kiln[test]')")


@not_in_subprocess
def test_under_interpreter():
    rerun_interpreted(__file__)


def direct(q, k, v, start, pos, scale, window):
    """Softmax attention of one query per head over slots max(start[b], pos + 1 - window) .. pos."""
    B, H, D = q.shape
    group = H // k.shape[2]
    out = torch.empty(B, H, D)
    for b in range(B):
        lo = int(start[b]) if not window else max(int(start[b]), int(pos) + 1 - window)
        keys = k[b, lo:int(pos) + 1].repeat_interleave(group, dim=1)  # [n, H, D]
        values = v[b, lo:int(pos) + 1].repeat_interleave(group, dim=1)
        probs = torch.softmax(torch.einsum("hd,nhd->hn", q[b], keys) * scale, dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", probs, values)
    return out


@interpreted
@pytest.mark.parametrize("heads,kv_heads,dim,capacity,window", [
    (6, 2, 16, 200, 0),    # grouped heads, several chunks, the last ones past the step
    (4, 1, 24, 70, 0),     # one key/value head, head dim not a power of two
    (4, 4, 32, 130, 50),   # no grouping, a window shorter than the row
])
def test_kernel_matches_direct_softmax(heads, kv_heads, dim, capacity, window):
    gen = torch.Generator().manual_seed(heads * capacity)
    q = torch.randn(3, heads, dim, generator=gen)
    k = torch.randn(3, capacity, kv_heads, dim, generator=gen)
    v = torch.randn(3, capacity, kv_heads, dim, generator=gen)
    start, pos = torch.tensor([0, 17, capacity // 2]), torch.tensor([capacity - 9])
    per_chunk, chunks = td.chunking(3, kv_heads, capacity)
    assert chunks > 1 and int(pos) // per_chunk < chunks - 1  # several chunks combine; the last is empty
    for _ in range(2):  # the second call finds the arrival counters back at zero
        got = td.decode_attention(q, k, v, start, pos, 0.25, window)
        torch.testing.assert_close(got, direct(q, k, v, start, pos, 0.25, window), rtol=1e-5, atol=1e-5)
        assert not arrival_counters(q.device, 3 * kv_heads).any()


@interpreted
@pytest.mark.parametrize("stages,balance,tma", [(None, False, False), (3, False, False), (3, False, True),
                                               (None, True, False)],
                         ids=["prefetched", "pipelined", "pipelined-tma", "balanced"])
@pytest.mark.parametrize("window", [0, 30])
def test_looping_program_reads_only_its_rows_valid_slots(monkeypatch, window, stages, balance, tma):
    """Few programs, so each loops over all of a row's blocks with the step's slot mid-cache (a server's
    rows): the blocks outside a row's valid range are not loaded, and the result is unchanged; with
    the next block prefetched by hand (None), through Triton's pipeline (LOOP_STAGES), and with the
    row's range split evenly (BALANCE); the pipeline's loads through TMA too."""
    monkeypatch.setattr(td, "TARGET_PROGRAMS", 1)
    monkeypatch.setattr(td, "LOOP_STAGES", stages)
    monkeypatch.setattr(td, "BALANCE", balance)
    monkeypatch.setattr(td, "TMA", tma)
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(3, 4, 16, generator=gen)
    k = torch.randn(3, 260, 2, 16, generator=gen)
    v = torch.randn(3, 260, 2, 16, generator=gen)
    start, pos = torch.tensor([0, 70, 85]), torch.tensor([90])
    block, per_chunk, chunks, _ = td.launch_settings(3, 2, 260)
    assert chunks == 1 and per_chunk // block >= 4  # one program per row and head walks every block
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[:, 128:], poisoned_v[:, 128:] = float("nan"), float("nan")  # past the step: never read
    assert td._tma_runs(poisoned_k, poisoned_v) is tma  # the interpreter runs TMA's loads where asked
    got = td.decode_attention(q, poisoned_k, poisoned_v, start, pos, 0.25, window)
    torch.testing.assert_close(got, direct(q, k, v, start, pos, 0.25, window), rtol=1e-5, atol=1e-5)



@interpreted
@pytest.mark.parametrize("stages,balance,programs,tma", [(None, False, 1, False), (3, False, 1, False),
                                                         (3, False, 1, True), (None, True, 1, False),
                                                         (None, True, 12, False)],
                         ids=["looping", "looping-pipelined", "looping-tma", "balanced", "balanced-2-chunks"])
def test_slots_outside_a_rows_range_never_reach_its_result(monkeypatch, stages, balance, programs, tma):
    """Every slot outside a row's valid range holds NaN (what an overflowed earlier request may leave
    in a server's cache): the rows' results are those of their own slots when programs walk several
    blocks (from the first block holding a valid slot), as at a server's batch sizes; with the
    row's range split evenly over two chunks too."""
    monkeypatch.setattr(td, "TARGET_PROGRAMS", programs)
    monkeypatch.setattr(td, "LOOP_STAGES", stages)
    monkeypatch.setattr(td, "BALANCE", balance)
    monkeypatch.setattr(td, "TMA", tma)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(3, 4, 16, generator=gen)
    k, v = torch.randn(3, 260, 2, 16, generator=gen), torch.randn(3, 260, 2, 16, generator=gen)
    start, pos = torch.tensor([0, 70, 133]), torch.tensor([200])
    block, per_chunk, _, _ = td.launch_settings(3, 2, 260)
    assert per_chunk > block
    poisoned_k, poisoned_v = k.clone(), v.clone()
    for row, first in enumerate(start.tolist()):
        for cache in (poisoned_k, poisoned_v):
            cache[row, :first], cache[row, int(pos) + 1:] = float("nan"), float("nan")
    got = td.decode_attention(q, poisoned_k, poisoned_v, start, pos, 0.25, 0)
    torch.testing.assert_close(got, direct(q, k, v, start, pos, 0.25, 0), rtol=1e-5, atol=1e-5)


@interpreted
@pytest.mark.parametrize("window", [0, 40])
def test_balanced_chunks_match_the_fixed_slices(monkeypatch, window):
    """BALANCE splits each row's valid range evenly over two looping chunks (rows of different first
    slots, the step's slot mid-cache): attention and the fused RoPE op (its output and the caches it
    writes) equal the fixed slices' results."""
    monkeypatch.setattr(td, "TARGET_PROGRAMS", 12)  # 3 rows x 2 heads x 2 chunks of 5 blocks
    gen = torch.Generator().manual_seed(13)
    heads, kv_heads, dim = 4, 2, 16
    q = torch.randn(3, heads, dim, generator=gen)
    qkv = torch.randn(3, (heads + 2 * kv_heads) * dim, generator=gen)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    cache_k, cache_v = torch.randn(3, 260, kv_heads, dim, generator=gen), torch.randn(3, 260, kv_heads, dim, generator=gen)
    pad, pos = torch.tensor([0, 70, 185]), torch.tensor([200])
    block, per_chunk, chunks, _ = td.launch_settings(3, kv_heads, 260)
    assert chunks == 2 and per_chunk > block
    results = {}
    for balance in (False, True):
        monkeypatch.setattr(td, "BALANCE", balance)
        k, v = cache_k.clone(), cache_v.clone()
        plain = td.decode_attention(q, cache_k, cache_v, pad, pos, 0.25, window)
        results[balance] = (plain, td.decode_attention_rope(qkv, inv_freq, k, v, pad, pos, 0.25, window, heads), k, v)
    torch.testing.assert_close(results[True][0], direct(q, cache_k, cache_v, pad, pos, 0.25, window),
                               rtol=1e-5, atol=1e-5)
    for mine, theirs in zip(results[True], results[False]):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    assert not torch.equal(results[True][2], cache_k)  # the step's key was written
    assert not arrival_counters(q.device, 3 * kv_heads).any()


@interpreted
def test_pipelined_loop_rotates_writes_and_attends_as_the_prefetching_one(monkeypatch):
    """The fused RoPE op in looping programs (few programs, left-padded rows, the step's slot mid-cache):
    with Triton's pipeline (LOOP_STAGES), its loads per thread or through TMA, the output and the
    caches it writes equal the hand-prefetched loop's."""
    monkeypatch.setattr(td, "TARGET_PROGRAMS", 1)
    gen = torch.Generator().manual_seed(11)
    heads, kv_heads, dim = 4, 2, 16
    qkv = torch.randn(3, (heads + 2 * kv_heads) * dim, generator=gen)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    cache_k, cache_v = torch.randn(3, 260, kv_heads, dim, generator=gen), torch.randn(3, 260, kv_heads, dim, generator=gen)
    pad, pos = torch.tensor([0, 70, 85]), torch.tensor([150])
    assert td.launch_settings(3, kv_heads, 260)[1] // td.launch_settings(3, kv_heads, 260)[0] >= 4
    results = {}
    for stages, tma in ((None, False), (3, False), (3, True)):
        monkeypatch.setattr(td, "LOOP_STAGES", stages)
        monkeypatch.setattr(td, "TMA", tma)
        k, v = cache_k.clone(), cache_v.clone()
        results[stages, tma] = (td.decode_attention_rope(qkv, inv_freq, k, v, pad, pos, 0.25, 0, heads), k, v)
    for piped in ((3, False), (3, True)):
        for mine, theirs in zip(results[piped], results[None, False]):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    assert not torch.equal(results[3, True][1], cache_k)  # the step's key was written

@pytest.mark.parametrize("batch,capacity,stages,tma,rope,balance", [
    (1, 640, None, False, True, False),     # batch 1: one block per program, loaded before the wait
    (32, 1024, 3, False, True, False),      # a server's batch: the pipelined loop, the step's slot folded in
    (32, 1024, 3, False, False, False),
    (32, 1024, 3, True, True, False),       # TMA's loads
    (32, 1024, None, False, True, False),   # the hand-prefetched loop
    (32, 1024, None, False, True, True),    # BALANCE
], ids=["one-block", "pipelined-rope", "pipelined", "pipelined-tma", "prefetched", "balanced"])
def test_kernel_compiles_for_hopper(batch, capacity, stages, tma, rope, balance):
    """Every path of the kernel compiles for sm_90 on this CPU (benchmarks/kernel_resources.py) with the
    3B shape's launch settings: the interpreter the other tests use runs code the GPU compiler
    refuses (the pipelined loop once carried a variable whose integer type changed inside it)."""
    resources = load_script("kernel_resources")
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton has no NVIDIA backend here")
    saved = td.LOOP_STAGES
    try:
        compiled, (block, per_chunk, _, _) = resources.decode_attention(
            td, batch=batch, slots=capacity, kv_heads=8, group=3, head_dim=128, stages=stages, rope=rope, tma=tma,
            balance=balance)
    finally:
        td.LOOP_STAGES = saved
    assert (per_chunk > block) == (batch > 1)
    used = resources.usage(compiled)
    assert 0 < used["registers"] <= 255 and used["shared_bytes"] > 0


def test_chunking_fills_the_gpu_in_whole_blocks():
    assert td.chunking(1, 8, 1280) == (64, 20)  # 20 chunks x 8 heads: 160 programs of one block each
    assert td.chunking(1, 8, 8192) == (256, 32)
    assert td.chunking(32, 8, 1280) == (1280, 1)  # a big batch fills the GPU by itself
    assert td.chunking(16, 8, 640) == (640, 1) and td.chunking(15, 8, 640) == (256, 3)  # ONE_CHUNK_FROM
    per_chunk, chunks = td.chunking(2, 4, 100, 32)
    assert per_chunk % 32 == 0 and per_chunk * chunks >= 100 > per_chunk * (chunks - 1)


def test_early_launch_only_for_the_fused_op_and_several_chunks(monkeypatch):
    """Programmatic dependent launch: the fused RoPE op of several chunks per row and head (batch 1:
    many short programs), not one looping chunk (batch 16 of 8 key/value heads), nor plain attention."""
    chunks = [td.launch_settings(batch, 8, 640)[2] for batch in (1, 16)]
    assert chunks == [20, 1]
    assert [td.early_launch(True, c) for c in chunks] == [True, False]
    assert not td.early_launch(False, 20)
    monkeypatch.setattr(td, "PDL_ONE_CHUNK", True)
    assert td.early_launch(True, 1)


def test_launch_settings_never_loop_with_two_warps():
    """One block per program where that fills the GPU (smallest block first, 2 warps); a program that
    loops over blocks gets 4 warps (with 2 its tiles spill: 20x slower at batch 16 on an H100)."""
    assert td.launch_settings(1, 8, 1280) == (64, 64, 20, 2)   # the batch-1 setting measured before
    assert td.launch_settings(1, 8, 640) == (32, 32, 20, 2)
    assert td.launch_settings(16, 8, 640) == (td.LOOP_BLOCK, 640, 1, 4)  # ONE_CHUNK_FROM: 16 x 8 heads
    assert td.launch_settings(8, 8, 640) == (td.LOOP_BLOCK, 192, 4, 4)
    for batch in (1, 2, 4, 8, 16, 32, 64):
        for capacity in (100, 640, 1280, 8192):
            block, per_chunk, chunks, warps = td.launch_settings(batch, 8, capacity)
            assert per_chunk * chunks >= capacity and (warps == 4 or per_chunk == block)


@interpreted
@pytest.mark.parametrize("family", ["llama3-tied", "qwen3", "mistral"])
def test_triton_decode_equals_matmul_decode(checkpoints, family):
    """Left-padded rows, grouped heads (qwen3: one key/value head) and Mistral's sliding window,
    which the kernel applies itself: each step's logits agree with the matmul path."""
    model = build_decoder(resolve_model(str(checkpoints[family])), device="cpu", dtype=torch.float32)
    tokens = torch.randint(0, 96, (3, 16), generator=torch.Generator().manual_seed(5))
    assert_decode_matches_matmul(model, "triton", tokens, torch.tensor([0, 3, 6]))


def test_triton_choice_is_checked(checkpoints, monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    with pytest.raises(ConfigError, match=r"--decode-attention: triton needs a CUDA device.*valid: auto, matmul, flash, triton"):
        da.check("triton", cpu, torch.bfloat16, 64, key="--decode-attention")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert "fp16 or bf16" in da.triton_unavailable(cuda, torch.float32, 128)
    assert "up to 256" in da.triton_unavailable(cuda, torch.bfloat16, 512)
    assert da.triton_unavailable(cuda, torch.bfloat16, 128) is None
    # auto: triton where it runs (a bf16 model on a GPU), matmul where it does not.
    assert da.check("auto", cuda, torch.bfloat16, 128) == "triton"
    assert da.check("auto", cuda, torch.float32, 128) == "matmul"
    assert da.check("auto", cpu, torch.bfloat16, 128) == "matmul"
    model = build_decoder(resolve_model(str(checkpoints["llama3-tied"])), device="cpu", dtype=torch.float32)
    with pytest.raises(ConfigError, match="decode_attention: triton needs a CUDA device"):
        Engine(model, decode_attention="triton")


@interpreted
def test_decode_step_with_triton_traces_as_one_graph(checkpoints):
    """dynamo takes the kernel as one opaque op (its fake gives the shapes): a decode step with it
    compiles with fullgraph=True, as the engine compiles it, and gives the eager logits."""
    model = build_decoder(resolve_model(str(checkpoints["qwen3"])), device="cpu", dtype=torch.float32)
    use_decode_kernels(model, attention="triton")
    tokens = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(6))
    pad = torch.tensor([0, 4])
    cache = KVCache(model.config, 2, 12, dtype=torch.float32, device="cpu")

    def step(token, slot):
        return model(token, cache=cache, pad=pad, decode_slot=slot)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        model(tokens[:, :9], cache=cache, pad=pad)
        eager = step(tokens[:, 9:], torch.tensor([9]))
        torch.testing.assert_close(compiled(tokens[:, 9:], torch.tensor([9])), eager, rtol=1e-5, atol=1e-5)


@interpreted
def test_fused_rope_attention_compiles_in_place_and_matches(checkpoints):
    """With `triton` a decode step's RoPE, cache write and attention are one op mutating the cache:
    compiled by inductor it is called on the caches themselves (no copy of them per step), and the
    logits and the caches it leaves equal the matmul path's step after step."""
    from torch._inductor.utils import run_and_get_code

    model = build_decoder(resolve_model(str(checkpoints["llama3-tied"])), device="cpu", dtype=torch.float32)
    kernel = use_decode_kernels(copy.deepcopy(model), attention="triton")
    tokens = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(7))
    caches = {side: KVCache(model.config, 1, 16, dtype=torch.float32, device="cpu") for side in ("matmul", "triton")}
    compiled = torch.compile(lambda tok, slot: kernel(tok, cache=caches["triton"], decode_slot=slot), fullgraph=True)
    with torch.no_grad():
        for cache in caches.values():
            model(tokens[:, :6], cache=cache)
        for t in range(6, 10):
            expected = model(tokens[:, t:t + 1], cache=caches["matmul"], decode_slot=torch.tensor([t]))
            got, code = run_and_get_code(compiled, tokens[:, t:t + 1], torch.tensor([t]))
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    for mine, theirs in zip(caches["triton"].k + caches["triton"].v, caches["matmul"].k + caches["matmul"].v):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    source = "\n".join(code)
    assert source.count("torch.ops.kiln.decode_attention_rope.default(") == model.config.n_layers
    assert "clone" not in source and ".copy_(" not in source


@interpreted
def test_attention_bench_calls_the_ops_as_the_decode_layer_does():
    """benchmarks/decode_attention_bench.py's two callers reach kiln's ops with their [B, 1, H, D] shapes
    (the bench broke once when the kernel module's wrappers went away)."""
    bench = load_script("decode_attention_bench")
    gen = torch.Generator().manual_seed(0)
    B, H, Hkv, D, S = 2, 4, 2, 16, 40
    k, v = torch.randn(B, S, Hkv, D, generator=gen), torch.randn(B, S, Hkv, D, generator=gen)
    q, pos, pad = torch.randn(B, 1, H, D, generator=gen), torch.tensor([30]), torch.tensor([0, 5])
    got = bench.attend(q, k, v, pad, pos, 0.25)
    assert got.shape == (B, 1, H, D)
    torch.testing.assert_close(got[:, 0], direct(q[:, 0], k, v, pad, pos, 0.25, 0), rtol=1e-5, atol=1e-5)
    qkv = torch.randn(B, 1, (H + 2 * Hkv) * D, generator=gen)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    out = bench.attend_rope(qkv, inv_freq, k.clone(), v.clone(), pad, pos, 0.25, H)
    assert out.shape == (B, 1, H, D) and torch.isfinite(out).all()
