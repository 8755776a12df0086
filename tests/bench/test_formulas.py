"""Every reported figure's arithmetic on known inputs, exactly: a changed formula fails here.

Covers kiln.bench.formulas itself, and the places that report through it: the ceilings
(copy/read bandwidth, matmul FLOP count), compile-bench rows (TFLOP/s, tokens/s, fraction of the
best matmul and of the datasheet, speedups, plain ratios), LLM-bench rows (decode and request tok/s,
roofline fractions, decode-vs-HF, prefill MFU) and the datasheet lookup.
"""

from __future__ import annotations

import math
import struct
from types import SimpleNamespace

import pytest
import torch

import kiln.bench.ceilings as ceilings
from kiln.bench import formulas as f
from kiln.bench.ceilings import Ceilings
from kiln.bench.compile.compile_rows import compare_with_plain, timing_figures
from kiln.bench.gpu_specs import lookup, spec_dtype
from kiln.monitor.flops import mfu
from kiln.timing import Timing


def test_formulas_on_known_inputs():
    assert f.ratio(3.0, 4.0) == 0.75
    assert f.ratio(None, 4.0) is None and f.ratio(3.0, 0.0) is None and f.ratio(3.0, None) is None
    assert f.matmul_flops(2, 3, 4) == 48
    assert f.matmul_flops(8192, 8192, 8192) == 2 * 8192**3
    assert f.tflops(5e12, 2.0) == 2.5
    assert f.peak_fraction(1e12, 0.5, 4e12) == 0.5
    assert f.decode_steps(256) == 255 and f.decode_steps(1) == 0 and f.decode_steps(0) == 0
    assert f.decode_tok_s(1, 256, 0.5) == 510.0  # 255 steps (the first token comes from the prefill)
    assert f.decode_tok_s(4, 11, 2.0) == 20.0
    assert f.decode_tok_s(1, 1, 0.5) is None
    assert f.request_tok_s(1, 256, 0.8) == 320.0  # all new tokens over the whole request
    assert f.prefill_tok_s(2, 1024, 0.25) == 8192.0
    assert f.decode_bytes_per_s(6_000_000_000, 400.0, 1) == 2.4e12
    assert f.decode_bytes_per_s(6_000_000_000, 400.0, 2) == 1.2e12  # a step makes `batch` tokens
    assert f.roofline_tok_s(3e12, 6_000_000_000, 1) == 500.0
    assert f.roofline_tok_s(3e12, 6_000_000_000, 4) == 2000.0
    assert f.speedup(10.0, 4.0) == 2.5
    # int4 (kiln's layout): 3B wo 3072 x 3072, groups of 128, bf16 scale and offset = 4,718,592 + 294,912
    assert f.int4_weight_bytes(3072, 3072) == 5_013_504
    assert f.int4_weight_bytes(256, 512, group=64, scale_bytes=4) == 256 * 512 // 2 + 2 * 8 * 256 * 4


def test_mfu_is_achieved_over_peak():
    assert mfu(3e12, 0.5, 12e12) == 0.5
    assert mfu(3e12, 0.5, None) is None and mfu(3e12, 0.0, 1e12) is None


def test_datasheet_lookup_by_cuda_name():
    h100 = lookup("NVIDIA H100 80GB HBM3")
    assert (h100.name, h100.bandwidth_tbs, h100.bytes_per_s) == ("H100 SXM5", 3.35, 3.35e12)
    assert h100.flops_per_s("bf16") == 989.4e12 and h100.flops_per_s("tf32") == 494.7e12
    assert h100.flops_per_s("fp32") == 66.9e12 and "H100" in h100.source
    h200 = lookup("NVIDIA H200")
    assert (h200.bandwidth_tbs, h200.flops_per_s("bf16")) == (4.8, 989.4e12)
    assert lookup("NVIDIA H100 PCIe").bandwidth_tbs == 2.0
    assert lookup("NVIDIA A100-SXM4-80GB").bandwidth_tbs == 2.039
    assert lookup("NVIDIA A100 80GB PCIe").bandwidth_tbs == 1.935
    assert lookup("NVIDIA A100-SXM4-40GB").bandwidth_tbs == 1.555
    assert lookup("NVIDIA A10").name == "A10" and lookup("NVIDIA L4").name == "L4"
    assert lookup("NVIDIA L40S").name == "L40S"
    assert lookup("Some Future GPU") is None and lookup(None) is None
    assert spec_dtype("torch.bfloat16", True) == "bf16" and spec_dtype("float16", False) == "fp16"
    assert spec_dtype("float32", True) == "tf32" and spec_dtype("float32", False) == "fp32"


def _timing(seconds: float, n: int = 3) -> Timing:
    return Timing((seconds,) * n)


def test_datasheet_flops_of_a_gpu_without_a_bandwidth_entry_come_from_the_mfu_table(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GH200 480GB")
    assert lookup("NVIDIA GH200 480GB") is None  # no bandwidth figure for it
    figures = ceilings.spec_figures(torch.device("cuda"), torch.bfloat16)
    assert figures["spec_flops_per_s"] == 989.4e12 and figures.get("spec_bytes_per_s") is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Unknown GPU")
    assert ceilings.spec_figures(torch.device("cuda"), torch.bfloat16)["spec_flops_per_s"] is None


def test_ceilings_count_bytes_and_flops_exactly(monkeypatch):
    monkeypatch.setattr(ceilings, "measure", lambda fn, **kw: _timing(0.5))
    assert ceilings.measure_copy_bandwidth("cpu", nbytes=1000) == 4000.0  # read + written
    rate, kernel, rates = ceilings.measure_read_bandwidth("cpu", nbytes=1024)
    assert rate == 2048.0 and set(rates) == {"sum_fp32", "amax_int64"}  # read once
    assert ceilings.measure_matmul_flops("cpu", torch.float32, n=64) == 2 * 64**3 / 0.5
    best, n, by_n = ceilings.measure_best_matmul("cpu", torch.float32, sizes=(32, 64))
    assert (best, n, by_n) == (2 * 64**3 / 0.5, 64, {32: 2 * 32**3 / 0.5, 64: 2 * 64**3 / 0.5})


def test_the_read_kernels_read_the_buffer():
    raw = bytes(range(64))
    buf = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    kernels = ceilings._read_kernels(buf)
    # Known answers worked out from the bytes themselves, not by the same torch call: the largest
    # little-endian 8-byte word is the last one, and the 16 floats summed in float64.
    assert int(kernels["amax_int64"]()) == int.from_bytes(raw[56:], "little")
    floats = struct.unpack("<16f", raw)
    assert float(kernels["sum_fp32"]()) == pytest.approx(math.fsum(floats), rel=1e-6)


def _ceil(**kw) -> Ceilings:
    base = dict(copy_bytes_per_s=2e12, matmul_flops_per_s=800e12, copy_bytes=1, matmul_n=8192, dtype="bfloat16",
                device="cuda", read_bytes_per_s=3e12, spec_bytes_per_s=4e12, spec_flops_per_s=1000e12)
    return Ceilings(**{**base, **kw})


def test_bandwidth_falls_back_to_the_copy():
    assert _ceil().bandwidth == 3e12 and _ceil(read_bytes_per_s=None).bandwidth == 2e12


class _Ctx(SimpleNamespace):
    def matmul_peak(self, precision):
        return 400e12

    def spec_peak(self, precision):
        return 500e12, "H100 SXM5: datasheet"


def test_compile_row_figures():
    ctx = _Ctx(flops_per_step=2e12, samples_per_step=128, tokens_per_step=None)
    row = {"precision": "bf16-mixed"}
    timing_figures(ctx, row, {"compiled": _timing(0.01), "eager": _timing(0.04), "eager_fp32": _timing(0.08)},
                   "compiled")
    assert row["step_ms"] == 10.0 and row["throughput"] == 12800.0
    assert row["tflops"] == 200.0 and row["matmul_peak_tflops"] == 400.0 and row["peak_frac"] == 0.5
    assert row["spec_peak_tflops"] == 500.0 and row["spec_peak_frac"] == 0.4
    assert row["spec_source"] == "H100 SXM5: datasheet"
    assert row["eager_step_ms"] == 40.0 and row["speedup"] == 4.0
    assert row["eager_fp32_step_ms"] == 80.0 and row["speedup_vs_eager_fp32"] == 8.0
    assert "tokens_per_s" not in row  # a model without tokens (the seed MLP) reports none


def test_compile_row_tokens_per_s():
    """A language model's row: tokens per step over the median step time."""
    ctx = _Ctx(flops_per_step=None, samples_per_step=4, tokens_per_step=4096)
    row = {"precision": "bf16-mixed"}
    timing_figures(ctx, row, {"compiled": _timing(0.25), "eager": _timing(0.5)}, "compiled")
    assert row["tokens_per_s"] == 16384.0 and row["throughput"] == 16.0


def test_speedups_against_the_plain_loop():
    def row(runner, mode, speedup):
        return {"runner": runner, "status": "ok", "precision": "fp32", "loss": "task", "mode": mode, "speedup": speedup}

    rows = [row("kiln", "reduce-overhead", 6.0), row("plain", "reduce-overhead", 2.0), row("plain", "default", 3.0)]
    compare_with_plain(rows)
    assert rows[0]["speedup_vs_plain"] == 3.0 and rows[0]["speedup_vs_best_plain"] == 2.0


def test_llm_rows_figures(tmp_path):
    """decode tok/s counts new_tokens - 1 steps; roofline fractions over the read stream, the
    datasheet and the copy; decode-vs-HF and prefill fractions; request tok/s."""
    import json

    from kiln.bench.llm.llm_bench import LlmBench
    from kiln.bench.llm.llm_options import LlmBenchPlan
    from kiln.llm.weights import decode_weight_bytes, random_decoder

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "tie_word_embeddings": True}))
    bench = LlmBench(LlmBenchPlan(model=str(tmp_path), engines=["hf-compiled", "kiln-compiled"], batches=(1,),
                                     prompt_len=10, new_tokens=11, device="cpu", dtype="fp32"), log=lambda m: None)
    bench.kiln_model = random_decoder(bench.config, device="cpu", dtype=torch.float32)
    bench.ceilings = _ceil()
    wb = decode_weight_bytes(bench.kiln_model)
    for name, decode_s, total_s, prefill_ms in (("hf-compiled", 0.5, 0.6, 40.0), ("kiln-compiled", 0.25, 0.32, 20.0)):
        r = bench.rows[name]
        r.decode, r.totals, r.ttft, r.intervals = [decode_s, decode_s * 3], [total_s], [0.01], [0.02, 0.03]
        r.row.prefill_ms = prefill_ms
    rows = {r.engine: r.to_json() for r in bench.finish_rows(flops=4_000_000_000)}
    kiln, hf = rows["kiln-compiled"], rows["hf-compiled"]
    # A step reads the weights and the KV cache: 1 layer x (k, v) x 2 heads x 16 dims x 4 bytes per slot,
    # over 10 + 5.5 slots on average (10 decode steps attend 11 .. 20 slots).
    kv = 2 * 2 * 16 * 4 * (10 + 5.5)
    assert kiln["kv_bytes_per_step"] == kv
    wb += kv
    assert kiln["decode_tok_s"] == 10 / 0.5  # median of [0.25, 0.75] = 0.5 s over 10 decode steps
    assert hf["decode_tok_s"] == 10 / 1.0
    assert kiln["request_tok_s"] == 11 / 0.32
    assert kiln["achieved_gbs"] == wb * 20 / 1e9
    assert kiln["roofline_frac"] == wb * 20 / 3e12 and kiln["roofline_spec_frac"] == wb * 20 / 4e12
    assert kiln["roofline_copy_frac"] == wb * 20 / 2e12
    assert kiln["roofline_tok_s"] == 3e12 / wb and kiln["spec_roofline_tok_s"] == 4e12 / wb
    assert kiln["decode_vs_hf"] == 2.0 and kiln["prefill_vs_hf"] == 2.0
    assert kiln["prefill_tok_s"] == 10 / 0.02 and kiln["prefill_tflops"] == 4e9 / 0.02 / 1e12
    assert kiln["prefill_peak_frac"] == 4e9 / 0.02 / 800e12 and kiln["prefill_spec_frac"] == 4e9 / 0.02 / 1000e12
    assert kiln["token_ms_p50"] == pytest.approx(25.0)


def test_gpt_fast_comparison_uses_the_peer_at_the_same_quant(tmp_path):
    from kiln.bench.llm.llm_bench import LlmBench
    from kiln.bench.llm.llm_options import LlmBenchPlan
    from kiln.llm.quant import QuantSpec

    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, '
        '"num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 64}')
    bench = LlmBench(LlmBenchPlan(model=str(tmp_path), engines=["kiln-compiled"], device="cpu", dtype="fp32",
                                     quants={"none": QuantSpec(), "int4@triton": QuantSpec("int4", backend="triton")}),
                     log=lambda m: None)
    bench.ceilings = _ceil()
    bench.rows["kiln-compiled"].row.request_tok_s = 300.0
    bench.rows["kiln-compiled[int4@triton]"].row.request_tok_s = 600.0
    from kiln.bench.peers.gpt_fast.peer import GPT_FAST
    from kiln.bench.peers.gpt_fast.row import GptFastRow

    peers = [row.to_json() for row in GPT_FAST.rows([
        GptFastRow(quant="none", batch=1, status="ok", request_tok_s=200.0, weight_bytes=1_000_000_000),
        GptFastRow(quant="int4", batch=1, status="ok", request_tok_s=400.0, weight_bytes=500_000_000)],
        bench.peer_context())]
    assert bench.rows["kiln-compiled"].row.to_json()["request_vs_gpt_fast"] == 1.5
    assert bench.rows["kiln-compiled[int4@triton]"].row.to_json()["request_vs_gpt_fast"] == 1.5
    assert bench.rows["kiln-compiled[int4@triton]"].row.to_json()["vs_gpt_fast"] == "gpt-fast[int4]"
    kv = bench.kv_bytes()[1]  # the KV cache a step reads, as kiln's rows count it
    assert peers[0]["step_bytes"] == 1_000_000_000 + kv
    assert peers[0]["roofline_frac"] == (1e9 + kv) * 200 / 3e12
    assert peers[1]["roofline_spec_frac"] == (5e8 + kv) * 400 / 4e12


def test_decode_vs_unquantized_is_the_quantized_rate_over_the_same_engines(tmp_path):
    from kiln.bench.llm.llm_bench import LlmBench
    from kiln.bench.llm.llm_options import LlmBenchPlan
    from kiln.bench.llm.llm_rows import ratios
    from kiln.llm.quant import QuantSpec

    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, '
        '"num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 64}')
    bench = LlmBench(LlmBenchPlan(model=str(tmp_path), engines=["kiln-compiled"], device="cpu", dtype="fp32",
                                     quants={"none": QuantSpec(), "int4": QuantSpec("int4")}), log=lambda m: None)
    bench.rows["kiln-compiled"].row.decode_tok_s = 300.0
    bench.rows["kiln-compiled[int4]"].row.decode_tok_s = 540.0
    ratios(bench.rows)
    assert bench.rows["kiln-compiled[int4]"].row.decode_vs_unquantized == 1.8
    assert "decode_vs_unquantized" not in bench.rows["kiln-compiled"].row.to_json()


def test_within_relative_is_the_tolerance_on_the_reference_magnitude():
    from kiln.bench.formulas import within_relative

    assert within_relative(2.03, 2.0, 0.02) and within_relative(1.97, 2.0, 0.02) and within_relative(2.0, 2.0, 0.0)
    assert not within_relative(2.05, 2.0, 0.02) and not within_relative(1.95, 2.0, 0.02)
    assert within_relative(-1.01, -1.0, 0.02) and not within_relative(0.5, 0.0, 0.5)


def test_kv_bytes_per_step_is_the_mean_over_the_decode_steps():
    """Step i of n-1 attends prompt + i slots, capped by a layer's window; k and v of each layer."""
    per_slot = 3 * 2 * 4 * 8 * 2  # batch 3, k and v, 4 heads, 8 dims, bf16
    assert f.kv_bytes_per_step(batch=3, prompt_len=100, new_tokens=5, n_layers=2, kv_heads=4, head_dim=8,
                               dtype_bytes=2) == 2 * per_slot * (101 + 102 + 103 + 104) // 4
    # layer 0 windowed at 102 slots: 101, 102, 102, 102; layer 1 full
    assert f.kv_bytes_per_step(batch=3, prompt_len=100, new_tokens=5, n_layers=2, kv_heads=4, head_dim=8,
                               dtype_bytes=2, windows=(102, None)) == per_slot * (407 + 410) // 4
    assert f.kv_bytes_per_step(batch=1, prompt_len=9, new_tokens=1, n_layers=1, kv_heads=1, head_dim=1,
                               dtype_bytes=2) == 0  # one new token: no decode step
    assert f.roofline_tok_s(3e12, 6_000_000_000 + 1_000_000_000, 16) == 3e12 / 7e9 * 16


def test_attended_kv_bytes_is_the_mean_over_a_window_of_steps_and_rows():
    """Rows of their own prompt lengths, steps 3 .. 5: a row of n tokens attends n + i slots at step i."""
    per_slot = 2 * 4 * 8 * 2  # k and v, 4 heads, 8 dims, bf16
    assert f.attended_kv_bytes(lengths=[10, 20], first_step=3, last_step=5, n_layers=2, kv_heads=4, head_dim=8,
                               dtype_bytes=2) == 2 * per_slot * ((13 + 14 + 15) + (23 + 24 + 25)) // 3
    # layer 0 windowed at 14 slots: row 0 attends 13, 14, 14 and row 1 14, 14, 14; layer 1 in full
    assert f.attended_kv_bytes(lengths=[10, 20], first_step=3, last_step=5, n_layers=2, kv_heads=4, head_dim=8,
                               dtype_bytes=2, windows=(14, None)) == per_slot * (41 + 42 + 42 + 72) // 3
    assert f.attended_kv_bytes(lengths=[10], first_step=4, last_step=3, n_layers=1, kv_heads=1, head_dim=1,
                               dtype_bytes=2) == 0  # an empty window


def test_batched_rows_compare_each_batch_with_its_own_and_with_batch_1(tmp_path):
    """Rows per batch size: tokens/s in all and per sequence, the step time over the same engine's
    batch-1 step, prefill FLOPs for B prompts, greedy tokens of the shared first prompt."""
    import json

    from kiln.bench.llm.llm_bench import LlmBench
    from kiln.bench.llm.llm_options import LlmBenchPlan
    from kiln.llm.weights import random_decoder

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64}))
    bench = LlmBench(LlmBenchPlan(model=str(tmp_path), engines=["kiln-compiled"], batches=(1, 4), prompt_len=10,
                                  new_tokens=11, device="cpu", dtype="fp32"), log=lambda m: None)
    assert list(bench.rows) == ["kiln-compiled b1", "kiln-compiled b4"] and len(bench.prompts) == 4
    bench.kiln_model = random_decoder(bench.config, device="cpu", dtype=torch.float32)
    bench.ceilings = _ceil()
    for name, decode_s, tokens in (("kiln-compiled b1", 0.5, [[5, 6, 7]]),
                                   ("kiln-compiled b4", 0.625, [[5, 6, 8], [1], [2], [3]])):
        r = bench.rows[name]
        r.decode, r.totals, r.ttft, r.intervals, r.tokens = [decode_s], [1.0], [0.01], [0.02], tokens
        r.row.prefill_ms = 10.0
    rows = {r.label: r.to_json() for r in bench.finish_rows(flops=1000)}
    one, four = rows["kiln-compiled b1"], rows["kiln-compiled b4"]
    assert four["decode_tok_s"] == 4 * 10 / 0.625 and four["decode_tok_s_per_seq"] == 10 / 0.625
    assert four["decode_step_ms"] == 62.5 and one["decode_step_ms"] == 50.0 and four["step_vs_batch1"] == 1.25
    assert four["prefill_flops"] == 4000 and one["prefill_flops"] == 1000
    assert four["kv_bytes_per_step"] == 4 * one["kv_bytes_per_step"]
    assert four["greedy_match_batch1"] == 2 and "step_vs_batch1" not in one


def test_causal_attention_flops_halve_torchs_count_and_add_the_recomputed_scores():
    from torch.utils.flop_counter import FlopCounterMode

    b, h, s, d = 2, 3, 16, 8
    assert f.causal_attention_flops(batch=b, heads=h, seq_len=s, head_dim=d, backward=False) == 2 * b * h * s * s * d
    assert f.causal_attention_flops(batch=b, heads=h, seq_len=s, head_dim=d, backward=True) == 7 * b * h * s * s * d
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    with FlopCounterMode(display=False) as fwd:
        out = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v  # the two products SDPA's kernels compute
    with FlopCounterMode(display=False) as bwd:
        out.sum().backward()
    full_fwd, full_bwd = fwd.get_total_flops(), bwd.get_total_flops()
    # torch counts every score (no causal half) and no recompute: forward 2 products, backward 4.
    assert f.causal_attention_flops(batch=b, heads=h, seq_len=s, head_dim=d, backward=False) * 2 == full_fwd
    assert f.causal_attention_flops(batch=b, heads=h, seq_len=s, head_dim=d, backward=True) * 2 \
        == full_fwd + full_bwd + full_fwd // 2
