"""The fused linear + cross-entropy kernels equal logits + F.cross_entropy in loss and gradients."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from kiln.errors import ConfigError
from kiln.train.cross_entropy import (
    ChunkedLinearCrossEntropy,
    chunk_tokens,
    linear_cross_entropy,
    resolve_ce_kernel,
)


def _case(n=37, d=16, v=50, ignore=0, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=dtype, requires_grad=True)
    w = torch.randn(v, d, generator=g, dtype=dtype, requires_grad=True)
    t = torch.randint(v, (n,), generator=g)
    t[:ignore] = -100
    return h, w, t


def _plain(h, w, t):
    return F.cross_entropy(h @ w.t(), t, ignore_index=-100)


def _loss_and_grads(fn, h, w, t):
    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss = fn(h, w, t)
    loss.backward()
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("chunk", [1, 8, 37, 64])
@pytest.mark.parametrize("ignore", [0, 5])
def test_chunked_equals_plain_in_loss_and_gradients(chunk, ignore):
    h, w, t = _case(ignore=ignore)
    expected = _loss_and_grads(_plain, h, w, t)
    got = _loss_and_grads(lambda a, b, c: ChunkedLinearCrossEntropy.apply(a, b, c, chunk), h, w, t)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


def test_chunked_scales_with_the_upstream_gradient():
    h, w, t = _case()
    _, gh, gw = _loss_and_grads(lambda a, b, c: 3.0 * ChunkedLinearCrossEntropy.apply(a, b, c, 8), h, w, t)
    _, eh, ew = _loss_and_grads(lambda a, b, c: 3.0 * _plain(a, b, c), h, w, t)
    torch.testing.assert_close(gh, eh)
    torch.testing.assert_close(gw, ew)


def test_every_target_ignored_gives_zero_loss_and_gradients():
    h, w, t = _case(n=6, ignore=6)
    loss, gh, gw = _loss_and_grads(lambda a, b, c: ChunkedLinearCrossEntropy.apply(a, b, c, 4), h, w, t)
    assert loss.item() == 0.0 and not gh.any() and not gw.any()


def test_no_grad_gives_the_loss_only():
    h, w, t = _case()
    with torch.no_grad():
        loss = ChunkedLinearCrossEntropy.apply(h, w, t, 8)
    torch.testing.assert_close(loss, _plain(h, w, t).detach())


def test_under_autocast_the_matmul_runs_in_bf16_like_plain():
    h, w, t = _case(n=64, d=32, v=96, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = _loss_and_grads(lambda a, b, c: linear_cross_entropy(a, b, c, "plain"), h, w, t)
        chunked = _loss_and_grads(lambda a, b, c: linear_cross_entropy(a, b, c, "chunked", chunk=16), h, w, t)
    for e, g in zip(plain, chunked):
        assert g.dtype == e.dtype == torch.float32  # gradients reach the fp32 masters through the cast
        torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-3)


def test_3d_hidden_states_are_flattened():
    h, w, t = _case(n=24)
    loss = linear_cross_entropy(h.view(4, 6, -1), w, t.view(4, 6), "chunked", chunk=5)
    torch.testing.assert_close(loss, _plain(h, w, t))


def test_chunk_size_bounds_the_fp32_logits():
    assert chunk_tokens(128256) == 2048
    assert chunk_tokens(512) == 1 << 19
    assert chunk_tokens(10**9) == 64


def test_resolve_kernel():
    assert resolve_ce_kernel("auto", True) == "chunked"
    assert resolve_ce_kernel("auto", False) == "plain"
    assert resolve_ce_kernel("plain", False) == "plain"
    with pytest.raises(ConfigError, match="training.ce_kernel.*llama:"):
        resolve_ce_kernel("chunked", False)


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is not None, reason="liger-kernel is installed")
def test_liger_without_the_package_names_the_install():
    with pytest.raises(ConfigError, match=r"training.ce_kernel.*kiln\[kernels\]"):
        resolve_ce_kernel("liger", True)


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None or not torch.cuda.is_available(),
                    reason="needs liger-kernel and a CUDA GPU (Triton kernels)")
def test_liger_equals_plain():
    h, w, t = _case(n=64, d=32, v=96, dtype=torch.float32)
    h, w, t = h.cuda(), w.cuda(), t.cuda()
    plain = _loss_and_grads(lambda a, b, c: linear_cross_entropy(a, b, c, "plain"), h, w, t)
    liger = _loss_and_grads(lambda a, b, c: linear_cross_entropy(a, b, c, "liger"), h, w, t)
    for e, g in zip(plain, liger):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def test_compiled_chunk_kernel_is_not_used_under_a_dispatch_mode(monkeypatch):
    """FLOP counting runs the loss under a dispatch mode, where torch.compile cannot run: the eager
    kernel serves it and the compiled one stays in use for training."""
    from torch.utils.flop_counter import FlopCounterMode

    from kiln.train import cross_entropy

    monkeypatch.setattr(cross_entropy, "_compiled", {})
    cuda = torch.device("cuda")
    with FlopCounterMode(display=False):
        assert cross_entropy._chunk_kernel(cuda) is cross_entropy._chunk_loss_and_grad
    assert cross_entropy._chunk_kernel(cuda) is not cross_entropy._chunk_loss_and_grad
    assert cross_entropy._chunk_kernel(torch.device("cpu")) is cross_entropy._chunk_loss_and_grad
    assert not cross_entropy._compiled.get("failed")


def test_the_chunk_kernel_falls_back_on_a_compiler_failure_but_not_on_out_of_memory(monkeypatch):
    """A compiler failure switches to the eager kernel for the process; running out of memory is the
    batch's problem, raised to the caller without retiring the compiled kernel."""
    from kiln.train import cross_entropy

    logits, targets, valid = torch.randn(4, 8), torch.randint(0, 8, (4,)), torch.ones(4, dtype=torch.bool)
    for error, raised in ((torch.OutOfMemoryError("CUDA out of memory"), True), (RuntimeError("no Triton"), False)):
        def failing(*_args, _error=error, **_kwargs):
            def compiled(*_a):
                raise _error
            return compiled

        monkeypatch.setattr(cross_entropy, "_compiled", {})
        monkeypatch.setattr(torch, "compile", failing)
        kernel = cross_entropy._chunk_kernel(torch.device("cuda"))
        if raised:
            with pytest.raises(torch.OutOfMemoryError):
                kernel(logits, targets, valid)
            assert not cross_entropy._compiled.get("failed")
        else:
            eager = cross_entropy._chunk_loss_and_grad(logits, targets, valid)
            for got, want in zip(kernel(logits, targets, valid), eager):
                torch.testing.assert_close(got, want)
            assert cross_entropy._compiled.get("failed")


def test_chunked_refuses_a_second_backward_instead_of_rescaling_its_gradients():
    h, w, t = _case()
    loss = ChunkedLinearCrossEntropy.apply(h, w, t, 8)
    loss.backward(retain_graph=True)
    first = h.grad.clone()
    with pytest.raises(RuntimeError, match="one backward per forward"):
        loss.backward()
    torch.testing.assert_close(h.grad, first)
