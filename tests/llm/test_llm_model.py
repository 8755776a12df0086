"""kiln's decoder against transformers' model with the same weights (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from kiln.llm import Engine, build_decoder, resolve_model
from kiln.llm.model import KVCache

from .conftest import FAMILIES, transformers


def _pair(directory):
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="sdpa").eval()
    kiln = build_decoder(resolve_model(str(directory)), device="cpu", dtype=torch.float32)
    return hf, kiln


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_equal_transformers(checkpoints, family):
    hf, kiln = _pair(checkpoints[family])
    tokens = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(tokens).logits
        got = kiln(tokens)
        last = kiln(tokens, last_only=True)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    # The same arithmetic on one row instead of all: a GEMM of another height may block its sums
    # differently (bitwise equal on Intel CPUs, within an ulp on AMD EPYC).
    torch.testing.assert_close(last, got[:, -1:], rtol=1e-5, atol=1e-6)


def test_sliding_window_is_applied(checkpoints):
    """Mistral's window (6) is shorter than the prompt: switching it off must change the logits."""
    hf, kiln = _pair(checkpoints["mistral"])
    tokens = torch.randint(0, 96, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        windowed = kiln(tokens)
        for layer in kiln.layers:
            layer.attn.window = None
        full = kiln(tokens)
    assert (windowed - full).abs().max() > 1e-3


@pytest.mark.parametrize("family", ["llama3-tied", "qwen3", "mistral"])
def test_decode_steps_match_a_full_forward(checkpoints, family):
    """Prefill into the static cache, then one-token steps: each step's logits equal the logits a
    full forward gives at that position (cache writes, decode mask, positions, window)."""
    _, kiln = _pair(checkpoints[family])
    tokens = torch.randint(0, 96, (2, 14), generator=torch.Generator().manual_seed(3))
    cache = KVCache(kiln.config, 2, 16, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        full = kiln(tokens)
        kiln(tokens[:, :8], cache=cache)
        for t in range(8, 14):
            step = kiln(tokens[:, t:t + 1], cache=cache, pad=torch.zeros(2, dtype=torch.long),
                        decode_slot=torch.tensor([t]))
            torch.testing.assert_close(step[:, 0], full[:, t], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", ["llama3-tied", "qwen2"])
def test_greedy_tokens_identical_to_transformers(checkpoints, family):
    hf, kiln = _pair(checkpoints[family])
    prompt = [1, 17, 33, 8, 54, 21, 9]
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                      pad_token_id=0)[0, len(prompt):].tolist()
    out = Engine(kiln).generate([prompt], max_new_tokens=24)
    assert out.tokens[0] == ref and out.finish == ["length"] and out.steps == 23


def test_left_padded_batch_matches_each_prompt_alone(checkpoints):
    """Prompts of different lengths share a batch through left padding; every row must decode as
    transformers decodes that prompt on its own."""
    hf, kiln = _pair(checkpoints["llama-untied"])
    prompts = [[1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41], [1, 60, 61], [1, 70, 71, 72, 73, 74]]
    out = Engine(kiln).generate(prompts, max_new_tokens=12)
    assert out.padded_len == 16
    for prompt, got in zip(prompts, out.tokens):
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
        assert got == ref
