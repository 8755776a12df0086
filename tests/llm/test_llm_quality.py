"""Quality figures of a quantized model (kiln.llm.quality): drift metrics and perplexity."""

from __future__ import annotations

import math

import pytest
import torch
from tests.llm.test_llm_quant import QUANT_CONFIG

from kiln.llm.config import config_from_dict
from kiln.llm.quality import DRIFT_LEN, DRIFT_PROMPTS, drift_prompts, logit_drift, perplexity
from kiln.llm.weights import random_decoder


@pytest.fixture(scope="module")
def model():
    return random_decoder(config_from_dict(QUANT_CONFIG), device="cpu", dtype=torch.float32, seed=0)


def test_drift_of_a_model_against_itself_is_zero(model):
    prompts = drift_prompts(256, 256)
    assert prompts.shape == (DRIFT_PROMPTS, DRIFT_LEN) and torch.equal(prompts, drift_prompts(256, 256))
    drift = logit_drift(model, model, prompts)
    assert drift["drift_max_abs"] == 0 and drift["drift_kl"] == 0 and drift["drift_top1"] == 1.0
    assert drift["drift_positions"] == DRIFT_PROMPTS * DRIFT_LEN


def test_drift_figures_follow_their_definitions(model):
    shifted = random_decoder(model.config, device="cpu", dtype=torch.float32, seed=0)
    with torch.no_grad():
        shifted.norm.weight.mul_(1.1)  # every logit scaled by 1.1: a known, pure logit change
    prompts = drift_prompts(256, 256)[:1, :16]
    drift = logit_drift(shifted, model, prompts)
    with torch.inference_mode():
        ref, got = model(prompts)[0], shifted(prompts)[0]
    assert drift["drift_max_abs"] == pytest.approx(float((got - ref).abs().max()), rel=1e-5)
    assert drift["drift_top1"] == 1.0  # scaling keeps the order
    spread = (ref - ref.mean(-1, keepdim=True)).pow(2).mean().sqrt()
    assert drift["drift_rel_err"] == pytest.approx(float((got - ref).pow(2).mean().sqrt() / spread), rel=1e-4)
    p, q = ref.log_softmax(-1), got.log_softmax(-1)
    assert drift["drift_kl"] == pytest.approx(float((p.exp() * (p - q)).sum(-1).mean()), rel=1e-4)


def test_perplexity_is_exp_of_the_mean_next_token_loss(model):
    tokens = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(3)).tolist()
    result = perplexity(model, tokens, context=32)
    nll, n = 0.0, 0
    with torch.inference_mode():
        for start in (0, 32, 64):  # windows of 32, 32 and 6 tokens
            window = torch.tensor(tokens[start: start + 32]).view(1, -1)
            logits = model(window)[0, :-1]
            nll += float(torch.nn.functional.cross_entropy(logits, window[0, 1:], reduction="sum"))
            n += window.shape[1] - 1
    assert result["ppl_tokens"] == n == 31 + 31 + 5
    assert result["ppl"] == pytest.approx(math.exp(nll / n), rel=1e-5)
    assert perplexity(model, tokens, context=32, max_tokens=32)["ppl_tokens"] == 31


def test_drift_prompts_come_from_the_ppl_text_when_long_enough():
    text = list(range(DRIFT_PROMPTS * DRIFT_LEN))
    assert drift_prompts(1000, 4096, text).flatten().tolist() == text
    assert not torch.equal(drift_prompts(1000, 4096, text[:10]), drift_prompts(1000, 4096, text))
    assert drift_prompts(1000, 64).shape == (DRIFT_PROMPTS, 64)  # short models: their length


def test_perplexity_bounds_are_ratios():
    from kiln.llm.quality import PPL_BOUNDS, judge_ppl

    assert PPL_BOUNDS["int8"] == 1.01 and PPL_BOUNDS["int4"] == 1.05
    assert judge_ppl("int8", 1.01) == (1.01, None)
    bound, problem = judge_ppl("int4", 1.0501)
    assert bound == 1.05 and "+5.01%" in problem and "int4 bound +5%" in problem
    assert judge_ppl("none", 9.0) == (None, None)
