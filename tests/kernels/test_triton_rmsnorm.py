"""kiln's RMSNorm kernel for a few rows (kiln.kernels.triton_rmsnorm) on CPU through Triton's
interpreter: against kiln's RMSNorm, and where a decode step runs it (a norm before the model's
own matmul whose input kiln's kernel wrote). The kernel tests run in a subprocess
(`test_under_interpreter`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kiln.llm import decode_matvec as dm
from kiln.llm.model import RMSNorm

from .triton_interpreter import interpreted, not_in_subprocess, rerun_interpreted

tn = pytest.importorskip("kiln.kernels.triton_rmsnorm", reason="Triton is not installed (pip install 'kiln[test]')")
ts = pytest.importorskip("kiln.kernels.triton_skinny", reason="Triton is not installed (pip install 'kiln[test]')")


@not_in_subprocess
def test_under_interpreter():
    rerun_interpreted(__file__)


@interpreted
@pytest.mark.parametrize("rows,dim,dtype", [(2, 96, torch.float32), (16, 64, torch.float16), (5, 200, torch.float16)])
def test_the_kernel_is_kilns_rmsnorm(rows, dim, dtype):
    """Rows of a width that is not a power of two too, in fp32 and fp16 (the interpreter truncates
    bf16 conversions, so bf16's rounding is checked on a GPU): eager's result, up to one last-bit
    difference where the sum of squares is added in another order; a strided input row-major."""
    torch.manual_seed(0)
    norm = RMSNorm(dim, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim))
    x = (torch.randn(rows, 2 * dim) * 3).to(dtype)[:, ::2]  # a strided view
    got, want = tn.rmsnorm_rows(x, norm.weight, norm.eps), norm(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    ulp = torch.finfo(dtype).eps * want.float().abs().clamp_min(1e-3)
    assert bool(((got.float() - want.float()).abs() <= ulp).all())
    assert (got != want).float().mean().item() < 0.01


def small_model():
    from kiln.llm.config import config_from_dict
    from kiln.llm.weights import random_decoder

    from ..llm.test_llm_quant import QUANT_CONFIG

    small = {**QUANT_CONFIG, "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128}
    return random_decoder(config_from_dict(small), device="cpu", dtype=torch.float32, seed=0)


@interpreted
@pytest.mark.parametrize("taken,norms_per_step", [
    ({(64, 64), (64, 128)}, 2 * 2 + 1),  # wo and w_down by the row kernel: every norm (2 layers, + the final)
    ({(64, 128)}, 2 + 1),                # w_down only: the norms before wqkv and the lm_head
    ({(64, 64)}, 2),                     # wo only: the norms before w_gate_up
    (set(), 0),                          # no row kernel: inductor's norms, as before
])
def test_a_batched_decode_runs_the_norm_kernel_after_kilns_kernels(monkeypatch, taken, norms_per_step):
    """Three left-padded prompts decoded with some projections through the row kernel (the table
    made to take those shapes): a norm before the model's own matmul runs as kiln's norm kernel
    exactly where its input was written by kiln's kernel, and every step's logits equal the plain
    model's."""
    from ..llm.conftest import assert_decode_matches_matmul

    monkeypatch.setattr(ts, "takes", lambda rows, n, k, gpu="": (n, k) in taken)
    calls = []
    real = torch.ops.kiln.rmsnorm_rows
    monkeypatch.setattr(torch.ops.kiln, "rmsnorm_rows", lambda *a, _r=real: calls.append(a[0].shape[0]) or _r(*a))
    tokens = torch.randint(0, 96, (3, 7), generator=torch.Generator().manual_seed(5))
    assert_decode_matches_matmul(small_model(), "matmul", tokens, torch.tensor([0, 2, 3]), prompt=4, matvec="triton",
                                 tol=1e-4)
    assert calls == [3] * (3 * norms_per_step)  # 3 decode steps of 3 rows


@interpreted
def test_one_row_and_the_setting_off_keep_their_own_norms(monkeypatch):
    """One row: kiln's one-row kernel fuses every norm (none left to run); NORM_KERNEL off: inductor's
    norm even after kiln's kernel."""
    monkeypatch.setattr(ts, "takes", lambda rows, n, k, gpu="": n == 64)
    calls = []
    real = torch.ops.kiln.rmsnorm_rows
    monkeypatch.setattr(torch.ops.kiln, "rmsnorm_rows", lambda *a, _r=real: calls.append(a[0].shape[0]) or _r(*a))
    norm, layer = RMSNorm(64, 1e-5), nn.Linear(64, 48)
    x = torch.randn(4, 1, 64)
    want = layer(norm(x))
    torch.testing.assert_close(dm.fused_linear(layer, x, norm=norm, after_kernel=True), want, rtol=1e-5, atol=1e-5)
    assert calls == [4]
    monkeypatch.setattr(dm, "NORM_KERNEL", False)
    torch.testing.assert_close(dm.fused_linear(layer, x, norm=norm, after_kernel=True), want, rtol=1e-5, atol=1e-5)
    assert calls == [4]
    assert not dm.kernel_writes(nn.Linear(64, 48), x) and dm.kernel_writes(nn.Linear(64, 64), x)
    one = torch.randn(1, 1, 64)
    assert dm.kernel_writes(nn.Linear(64, 48), one)  # one row: the one-row kernel reads every dense weight
    monkeypatch.setattr(dm, "NORM_KERNEL", True)
    torch.testing.assert_close(dm.fused_linear(layer, one, norm=norm, after_kernel=True), layer(norm(one)),
                               rtol=1e-5, atol=1e-5)
    assert calls == [4]  # the norm went into the one-row kernel
