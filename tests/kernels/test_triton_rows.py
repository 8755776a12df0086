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

from .test_triton_int4 import check_int4_op
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
])
def test_int4_rows_match_the_dequantized_math(out_f, in_f, group, rows, bias, prologue, swiglu, residual, setting):
    check_int4_op(torch.ops.kiln.int4_rows, out_f, in_f, group, rows, bias, prologue, swiglu, residual, setting,
                  seed=out_f + in_f + rows)


@interpreted
def test_batched_decode_with_int4_triton_weights():
    """Three prompts, left-padded to different lengths: every decode step through the row kernels
    equals the dequantized reference's."""
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
    """One row: the one-row kernels; several: int4 weights through the row kernel, dense weights
    through the model's own matmul; more rows than the kernels take (prefill): the plain layer."""
    calls = []
    for name in ("matvec", "int4_matvec", "int4_rows"):
        real = getattr(torch.ops.kiln, name)
        monkeypatch.setattr(torch.ops.kiln, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    dense = nn.Linear(64, 32)
    int4 = ti.Int4TritonLinear.from_linear(nn.Linear(64, 32), 32)
    for layer in (dense, int4):
        for rows in (1, dm.ROWS_KERNEL_FROM, tr.MAX_ROWS + 1):
            y = dm.fused_linear(layer, torch.randn(rows, 1, 64))
            assert y.shape == (rows, 1, 32)
    assert calls == ["matvec", "int4_matvec", "int4_rows"]
