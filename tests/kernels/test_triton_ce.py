"""training.ce_kernel=triton (kiln.kernels.triton_ce): the loss and its gradient equal
F.cross_entropy's on the same logits, ignored targets included, inside any causal LM's loss; its
Triton kernels (kiln.kernels.triton_ce_kernel) match the reference under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln.config.schema import ModelConfig
from kiln.kernels.triton_ce import triton_cross_entropy
from kiln.models import build_model
from kiln.train.cross_entropy import resolve_ce_kernel
from kiln.train.losses import build_forward_loss

from .triton_interpreter import interpreted, not_in_subprocess, rerun_interpreted


def _logits(dtype, rows=12, vocab=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, vocab, generator=g) * 4).to(dtype).requires_grad_(True)
    t = torch.randint(vocab, (rows,), generator=g)
    t[::5] = -100
    return x, t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_pytorch_in_loss_and_gradient(dtype):
    x, t = _logits(dtype)
    ref_in = x.detach().clone().requires_grad_(True)
    got = triton_cross_entropy(x, t)
    ref = F.cross_entropy(ref_in.float(), t)
    (got * 3).backward()
    (ref * 3).backward()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    # bf16 logits: the gradient is computed in fp32 and rounded once, as PyTorch's of the fp32 copy then rounded
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 0, "atol": 2**-12}
    torch.testing.assert_close(x.grad.float(), ref_in.grad.to(dtype).float(), **tol)
    assert x.grad[t == -100].abs().sum() == 0


def test_3d_logits_and_all_targets_ignored():
    x, t = _logits(torch.float32, rows=12)
    got = triton_cross_entropy(x.view(3, 4, -1), t.view(3, 4))
    torch.testing.assert_close(got, F.cross_entropy(x.float(), t))
    x.grad = None
    zero = triton_cross_entropy(x, torch.full_like(t, -100))
    zero.backward()
    assert zero.item() == 0 and x.grad.abs().sum() == 0


def test_in_a_causal_lm_loss_it_equals_plain():
    torch.manual_seed(0)
    built = build_model(ModelConfig(name="llama:llama-tiny"))
    model = built.module
    window = torch.randint(512, (2, 17), generator=torch.Generator().manual_seed(1))
    losses, grads = {}, {}
    for kernel in ("plain", "triton"):
        model.zero_grad(set_to_none=True)
        loss = build_forward_loss(model, "causal_lm", kernel)(window[:, :-1], window[:, 1:])
        loss.backward()
        losses[kernel], grads[kernel] = loss.detach(), [p.grad.clone() for p in model.parameters()]
    torch.testing.assert_close(losses["triton"], losses["plain"], rtol=1e-6, atol=1e-6)
    for a, b in zip(grads["triton"], grads["plain"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_resolve_needs_only_logits():
    assert resolve_ce_kernel("triton", True) == "triton"
    assert resolve_ce_kernel("triton", False) == "triton"  # hf: models give logits only; enough here


@not_in_subprocess
def test_under_interpreter():
    rerun_interpreted(__file__)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernels_match_the_reference(dtype, monkeypatch):
    from kiln.kernels import triton_ce_kernel
    from kiln.kernels.triton_ce import _reference_backward, _reference_rows

    # several blocks per row, the last one partial
    monkeypatch.setattr(triton_ce_kernel, "FWD_BLOCK", 64)
    monkeypatch.setattr(triton_ce_kernel, "BWD_BLOCK", 64)
    x, t = _logits(dtype, rows=5, vocab=300)
    x = x.detach()
    x[1] = float("-inf")  # a row with one finite logit: no NaN from the running maximum
    x[1, 7] = 0.5
    t[1] = 7
    loss, lse = triton_ce_kernel.ce_forward(x, t)
    ref_loss, ref_lse = _reference_rows(x, t)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert loss[1] == 0 and lse[1] == 0.5
    g = torch.rand(5)
    dx, ref_dx = triton_ce_kernel.ce_backward(x, t, lse, g), _reference_backward(x, t, ref_lse, g)
    tol = 1e-6 if dtype == torch.float32 else 2**-7  # the interpreter truncates to bf16: one ulp
    torch.testing.assert_close(dx.float(), ref_dx.float(), rtol=tol, atol=1e-6)
    assert dx[t == -100].abs().sum() == 0
