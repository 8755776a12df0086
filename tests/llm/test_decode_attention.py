"""The flash decode path's bookkeeping (where each row's keys start, how many it uses, grouped
heads) against the matmul path, on CPU: FlashAttention's kernel is CUDA-only, so a reference of
its varlen semantics stands in for it here; benchmarks/decode_attention_check.py runs the real
kernel against the matmul path on a GPU."""

from __future__ import annotations

import pytest
import torch

from kiln.errors import ConfigError
from kiln.llm import Engine, build_decoder, resolve_model
from kiln.llm import decode_attention as da

from .conftest import assert_decode_matches_matmul, transformers  # noqa: F401  (transformers: skips without it)


def reference_varlen(q, k, v, cu_q, cu_k, used_k, max_k, scale):
    """FlashAttention-2's varlen forward with seqused_k, one query per row: row b reads keys
    cu_k[b] .. cu_k[b] + used_k[b] - 1; query head h uses key/value head h // (H // Hkv)."""
    B, H, D = q.shape
    group = H // k.shape[1]
    assert cu_q.tolist() == list(range(B + 1)) and cu_q.dtype == cu_k.dtype == used_k.dtype == torch.int32
    out = torch.empty_like(q)
    for b in range(B):
        start, n = int(cu_k[b]), int(used_k[b])
        assert 1 <= n and start + n <= k.shape[0] and n <= max_k
        keys = k[start:start + n].repeat_interleave(group, dim=1)  # [n, H, D]
        values = v[start:start + n].repeat_interleave(group, dim=1)
        probs = torch.softmax(torch.einsum("hd,nhd->hn", q[b].float(), keys.float()) * scale, dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", probs, values.float()).to(q.dtype)
    return out


@pytest.mark.parametrize("family", ["llama3-tied", "qwen3", "mistral"])
def test_flash_decode_equals_matmul_decode(checkpoints, monkeypatch, family):
    """Left-padded rows, grouped heads (qwen3: one key/value head), Mistral's windowed layers
    (which keep the matmul path): each step's logits agree between the two kernels."""
    monkeypatch.setattr(da, "varlen_forward", reference_varlen)
    model = build_decoder(resolve_model(str(checkpoints[family])), device="cpu", dtype=torch.float32)
    tokens = torch.randint(0, 96, (3, 14), generator=torch.Generator().manual_seed(4))
    assert_decode_matches_matmul(model, "flash", tokens, torch.tensor([0, 3, 6]))


def test_flash_decode_without_padding(monkeypatch):
    monkeypatch.setattr(da, "varlen_forward", reference_varlen)
    q = torch.randn(2, 1, 6, 8)
    k, v = torch.randn(2, 10, 2, 8), torch.randn(2, 10, 2, 8)
    rows = da.varlen_rows(2, 10, torch.tensor([4]), None)
    assert [r.tolist() for r in rows] == [[0, 1, 2], [0, 10, 20], [5, 5]]
    got = da.flash_decode(q, k, v, rows, 0.3)
    keys, values = k[:, :5].repeat_interleave(3, dim=2), v[:, :5].repeat_interleave(3, dim=2)
    probs = torch.softmax(torch.einsum("bhd,bshd->bhs", q[:, 0], keys) * 0.3, dim=-1)
    torch.testing.assert_close(got[:, 0], torch.einsum("bhs,bshd->bhd", probs, values))


def test_varlen_rows_with_padding():
    cu_q, cu_k, used = da.varlen_rows(3, 20, torch.tensor([11]), torch.tensor([0, 3, 6]))
    assert cu_q.tolist() == [0, 1, 2, 3] and cu_k.tolist() == [0, 23, 46, 60] and used.tolist() == [12, 9, 6]


def test_check_choices():
    cpu = torch.device("cpu")
    assert da.check("matmul", cpu, torch.float32, 64) == "matmul"
    with pytest.raises(ConfigError, match="decode_attention: flash needs a CUDA device"):
        da.check("flash", cpu, torch.bfloat16, 64)
    with pytest.raises(ConfigError, match=r"--decode-attention: unknown .*'flahs'.*valid: auto, matmul, flash, triton"):
        da.check("flahs", cpu, torch.float32, 64, key="--decode-attention")


def test_unavailable_reasons(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert "fp16 or bf16" in da.flash_unavailable(cuda, torch.float32, 128)
    assert "multiple of 8" in da.flash_unavailable(cuda, torch.bfloat16, 100)
    assert "up to 256" in da.flash_unavailable(cuda, torch.bfloat16, 512)
    assert da.flash_unavailable(cuda, torch.bfloat16, 128) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert "8.0 or newer" in da.flash_unavailable(cuda, torch.bfloat16, 128)


def test_engine_kernel_choice(checkpoints):
    model = build_decoder(resolve_model(str(checkpoints["llama3-tied"])), device="cpu", dtype=torch.float32)
    assert Engine(model).decode_kernel == "matmul"
    with pytest.raises(ConfigError, match="decode_attention: flash needs a CUDA device"):
        Engine(model, decode_attention="flash")
