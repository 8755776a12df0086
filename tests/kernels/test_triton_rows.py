"""kiln's int4 decode projections for several rows (kiln.kernels.triton_rows) on CPU through Triton's
interpreter: the kernel against the dequantized math for each fused part (RMSNorm, SwiGLU before,
the folded norm's scalar and the SwiGLU epilogue, bias, residual), row counts that leave the row
tile partly empty, partial output blocks and uneven splits; a batched decode step of a model with
int4@triton weights against its dequantized reference; and which kernel a decode step picks by its
row count. The kernel tests run in a subprocess (`test_under_interpreter`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kiln.llm import decode_matvec as dm

from .test_triton_int4 import check_int4_op, eager_reference
from .triton_interpreter import interpreted, not_in_subprocess, rerun_interpreted

tr = pytest.importorskip("kiln.kernels.triton_rows", reason="Triton is not installed (pip install 'kiln[test]')")
ti = pytest.importorskip("kiln.llm.int4_layout")


@not_in_subprocess
def test_under_interpreter():
    rerun_interpreted(__file__)


def test_row_tiles_are_powers_of_two_from_16():
    assert [tr.block_m(n) for n in (2, 16, 17, 33, 64)] == [16, 16, 32, 64, 64]


@interpreted
@pytest.mark.parametrize("out_f,in_f,group,rows,bias,prologue,swiglu,residual,setting", [
    (40, 256, 32, 2, False, "none", False, False, [16, 1]),      # a partial block
    (16, 512, 128, 3, True, "none", False, False, [16, 3]),      # 4 groups in 3 uneven splits, a bias
    (24, 256, 64, 5, False, "rmsnorm", False, True, [32, 2]),    # unfolded norm per x, a residual
    (24, 128, 32, 2, True, "silu_mul", False, False, [16, 4]),   # SwiGLU of the input halves first
    (48, 256, 32, 17, False, "rms", True, False, [32, 2]),       # folded norm's scalar; SwiGLU epilogue; 17 rows
    (24, 256, 64, 9, False, "rms", False, True, [16, 4, 4, 3]),  # folded norm's sums of squares from 4 splits
    (40, 128, 32, 70, True, "none", False, False, [32, 1, 4, 2, 32]),  # prefill: 3 row blocks of 32, a partial one
    (32, 256, 64, 20, False, "rms", True, False, [16, 2, 4, 2, 16, 0]),  # 2 row blocks x 2 splits; no prefetch
    # groups of 128 and more: the weight as the products' first operand (SWAP)
    (48, 256, 128, 17, False, "rms", True, False, [32, 2]),      # folded norm, SwiGLU epilogue, 2 row blocks
    (32, 256, 128, 40, False, "rms", True, False, [16, 2, 4, 2, 32]),  # 2 row blocks of 32 x 2 splits
    (24, 512, 128, 5, True, "rmsnorm", False, True, [16, 3]),    # unfolded norm, bias, residual, uneven splits
    (40, 256, 128, 4, False, "silu_mul", False, False, [32, 1]),  # SwiGLU before; a partial output block
    (24, 512, 256, 9, False, "rms", False, True, [16, 2]),       # groups of 256: 32 word rows per product
    (40, 256, 128, 3, False, "rms", False, False, [16, 2, 4, 2, 16, 0, 0]),  # SWAP 0: the unpacked tile
])
def test_int4_rows_match_the_dequantized_math(out_f, in_f, group, rows, bias, prologue, swiglu, residual, setting):
    check_int4_op(torch.ops.kiln.int4_rows, out_f, in_f, group, rows, bias, prologue, swiglu, residual, setting,
                  seed=out_f + in_f + rows)


@interpreted
@pytest.mark.parametrize("group,rows,prologue,swiglu,residual", [
    (128, 17, "rms", True, False),   # folded norm, SwiGLU epilogue, 2 row blocks
    (256, 5, "rmsnorm", False, True),  # groups of 256: 32 word rows; unfolded norm, residual
])
@pytest.mark.parametrize("x_once,scales_ahead", [(True, False), (False, True), (True, True)])
def test_swap_loop_variants_match(monkeypatch, group, rows, prologue, swiglu, residual, x_once, scales_ahead):
    """SWAP_X_ONCE cuts the eight nibble positions' input tiles from one read of the group's inputs,
    SWAP_SCALES_AHEAD reads scales and offsets a group ahead (3 uneven splits: a split's last group
    reads none ahead): the same products, against the dequantized math (and able to fail)."""
    monkeypatch.setattr(tr, "SWAP_X_ONCE", x_once)
    monkeypatch.setattr(tr, "SWAP_SCALES_AHEAD", scales_ahead)
    check_int4_op(torch.ops.kiln.int4_rows, 48, 1024 if group == 128 else 512, group, rows, False, prologue, swiglu,
                  residual, [32, 3], seed=rows)


@interpreted
@pytest.mark.parametrize("group", [64, 128])
def test_16_bit_inputs_take_the_magic_number_path(group):
    """In fp16 (and bf16) the unpacked tile holds MAGIC + q (q in the mantissa's low bits); the product
    is corrected by MAGIC times each row's input sum (both loops: group 128 takes SWAP). fp16 only:
    Triton's interpreter multiplies bf16 tiles' raw bits in `tl.dot` (the GPU benchmark checks bf16
    against fp32, and bf16 on a GPU unpacks through inline PTX, which the interpreter cannot run)."""
    torch.manual_seed(2)
    layer = ti.Int4TritonLinear.from_linear(nn.Linear(256, 32, bias=False), group).to(torch.float16)
    x = torch.randn(3, 256).to(torch.float16)
    y = torch.ops.kiln.int4_rows(x, layer.weight, layer.scale, layer.offset, group, None, None, 1e-5, "rms", False,
                                 None, [16, 2])
    expected = eager_reference(layer, x, "rms", False, None, None)
    torch.testing.assert_close(y.float(), expected, rtol=2e-2, atol=2e-2 * float(expected.abs().max()))


def test_splits_of_many_row_blocks_are_refused():
    layer = ti.Int4TritonLinear.from_linear(nn.Linear(64, 16), 32)
    with pytest.raises(ValueError, match="arrival counters"):
        tr.int4_rows(torch.randn(300, 64), layer.weight, layer.scale, layer.offset, 32, None, None, 0.0, 0, False, None,
                     [16, 2, 4, 2, 16])  # 19 row blocks x 1 output block > 16 counters


def test_settings_rule():
    """Prefill: 128 x 128 tiles, no splits; decode: 128-wide blocks of 16 rows, splits doubled until
    every SM has two programs, never past MAX_SPLIT or the groups."""
    assert tr.choose_setting(512, 5120, 3072, 128, 132)[:5] == (128, 1, 8, 3, tr.PREFILL_BLOCK_M)
    assert [tr.choose_setting(16, 5120, 3072, g, 132)[6] for g in (32, 64, 128, 256)] == [0, 0, 1, 1]
    assert tr.choose_setting(16, 5120, 3072, 128, 132)[:2] == (128, 8)  # 40 blocks x 8 >= 264
    assert tr.choose_setting(2, 128256, 3072, 128, 132)[1] == 1
    assert tr.choose_setting(33, 3072, 256, 128, 132)[1] == 2  # 2 groups: 2 splits at most
    assert tr.choose_setting(64, 5120, 3072, 128, 132)[1] == 2  # 40 blocks x 4 row blocks x 2
    assert [tr.row_block(r) for r in (2, 16, 64, 65)] == [16, 16, tr.DECODE_BLOCK_M, tr.PREFILL_BLOCK_M]
    assert tr.choose_setting(32, 5120, 3072, 128, 132)[4] == tr.DECODE_BLOCK_M  # 17-32 rows: two row blocks


@interpreted
def test_dequantized_product_for_prefill():
    """kiln::int4_linear_dequant equals x times the layer's dequantized weight, the dequant kernel
    writes that weight (N a partial or whole number of blocks), and the layer takes int4_path's
    kernel at each row count."""
    import kiln.kernels.triton_int4_dequant as dq

    torch.manual_seed(3)
    layer = ti.Int4TritonLinear.from_linear(nn.Linear(256, 40, bias=True), 64)
    x = torch.randn(5, 256)
    expected = x @ layer.dequantize(torch.float32, stored_order=True).t()
    torch.testing.assert_close(dq.int4_linear_dequant(x, layer.weight, layer.scale, layer.offset, 64), expected,
                               rtol=1e-4, atol=1e-4)
    for out_f in (40, dq.BLOCK_N):  # a partial block of outputs (masked), whole blocks only (unmasked)
        other = ti.Int4TritonLinear.from_linear(nn.Linear(256, out_f, bias=False), 64)
        assert torch.equal(dq.int4_dequantize_t(other.weight, other.scale, other.offset, 64, torch.float32),
                           other.dequantize(torch.float32, stored_order=True).t())
    # in bf16 the kernel rounds that fp32 weight once (the interpreter's bf16 store truncates, so
    # this is checked on the reference side): the dequantized reference must too
    half = ti.Int4TritonLinear.from_linear(nn.Linear(256, 40).to(torch.bfloat16), 64)
    assert torch.equal(half.dequantize(), half.dequantize(torch.float32).to(torch.bfloat16))
    assert [ti.int4_path(r) for r in (1, ti.INT4_ROWS_FROM - 1, ti.INT4_ROWS_FROM, ti.ROWS_UP_TO, ti.ROWS_UP_TO + 1)] == [
        "matvec", "matvec", "rows", "rows", "dequant"]
    for rows in (1, ti.INT4_ROWS_FROM, ti.ROWS_UP_TO + 1):
        xr = torch.randn(rows, 256)
        torch.testing.assert_close(layer(xr), xr @ layer.dequantize(torch.float32).t() + layer.bias, rtol=1e-4,
                                   atol=1e-4)


@interpreted
def test_a_compiled_prefill_dequantizes_inside_its_graph(monkeypatch):
    """Above ROWS_UP_TO rows a compiled forward holds the dequant kernel as a Triton op (PREFILL_DEQUANT
    `graph`), torch ops (`torch`) or the opaque product op (`kernel`); all equal the reference."""
    torch.manual_seed(4)
    layer = ti.Int4TritonLinear.from_linear(nn.Linear(256, 48, bias=True), 64)
    x = torch.randn(ti.ROWS_UP_TO + 3, 256)
    expected = x @ layer.dequantize(torch.float32).t() + layer.bias
    graphs = []

    def capture(gm, inputs):
        graphs.append(gm)
        return gm.forward

    for mode, op in (("graph", "kiln.int4_dequantize_t"), ("torch", None), ("kernel", "kiln.int4_linear_dequant")):
        monkeypatch.setattr(ti, "PREFILL_DEQUANT", mode)
        torch._dynamo.reset()
        graphs.clear()
        y = torch.compile(layer, backend=capture, fullgraph=True)(x)
        torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)
        targets = {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
        assert {t for t in targets if t.startswith("kiln.")} == ({op} if op else set()), (mode, targets)
    torch._dynamo.reset()


@interpreted
def test_batched_decode_with_int4_triton_weights(monkeypatch):
    """Three prompts, left-padded to different lengths: every decode step through the row kernels
    (taken from 2 rows here) equals the dequantized reference's."""
    monkeypatch.setattr(ti, "INT4_ROWS_FROM", 2)
    from kiln.llm.config import config_from_dict
    from kiln.llm.quant import QuantSpec, dequantized_reference, quantize_decoder
    from kiln.llm.weights import random_decoder

    from ..llm.conftest import assert_decode_matches_matmul
    from ..llm.test_llm_quant import QUANT_CONFIG

    small = {**QUANT_CONFIG, "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128}
    model = random_decoder(config_from_dict(small), device="cpu", dtype=torch.float32, seed=0)
    spec = QuantSpec(kind="int4", group_size=32, backend="triton")
    quantized = quantize_decoder(model, spec)
    tokens = torch.randint(0, 96, (3, 7), generator=torch.Generator().manual_seed(5))
    assert_decode_matches_matmul(quantized, "matmul", tokens, torch.tensor([0, 2, 3]), prompt=4, matvec="triton",
                                 tol=1e-4, reference=dequantized_reference(model, quantized, spec))


@interpreted
def test_decode_steps_pick_the_kernel_by_rows(monkeypatch):
    """One row: the one-row kernels; several: dense weights through the model's own matmul, int4
    weights through the row kernel from INT4_ROWS_FROM rows; more rows than that kernel takes: the
    plain layer (int4: its dequantized matmul)."""
    calls = []
    for name in ("matvec", "int4_matvec", "int4_rows"):
        real = getattr(torch.ops.kiln, name)
        monkeypatch.setattr(torch.ops.kiln, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    dense = nn.Linear(64, 32)
    int4 = ti.Int4TritonLinear.from_linear(nn.Linear(64, 32), 32)
    for layer, row_counts in ((dense, (1, dm.ROWS_KERNEL_FROM, tr.MAX_ROWS + 1)),
                              (int4, (1, ti.INT4_ROWS_FROM, ti.ROWS_UP_TO + 1))):
        for rows in row_counts:
            y = dm.fused_linear(layer, torch.randn(rows, 1, 64))
            assert y.shape == (rows, 1, 32)
    assert calls == ["matvec", "int4_matvec", "int4_rows"]  # the last int4 call: the dequantized matmul


@pytest.mark.parametrize("projection", ["wqkv", "w_gate_up", "w_down"])
def test_kernel_compiles_for_hopper(projection):
    """Both loops compile for sm_90 on this CPU (benchmarks/kernel_resources.py) with the fused parts
    of the 3B's projections at 16 rows, the SWAP loop with its inline PTX, which Triton's interpreter
    never runs; neither spills, and the SWAP loop asks for less shared memory (its weight tile never
    goes through it)."""
    from tests.benchmark_scripts import load_script

    resources = load_script("kernel_resources")
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton has no NVIDIA backend here")
    n, k, prologue, swiglu, residual = resources.INT4_3B[projection]
    used = {swap: resources.usage(resources.int4_rows(tr, n=n, k=k, group=128, prologue=prologue, swiglu=swiglu,
                                                      residual=residual, rows=16, swap=swap))
            for swap in (False, True)}
    assert all(0 < u["registers"] <= 255 and u["stack_bytes"] == 0 for u in used.values())
    assert used[True]["shared_bytes"] < used[False]["shared_bytes"]
