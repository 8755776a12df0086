"""Quality figures of a quantized model (kiln.llm.quality): drift metrics and perplexity."""

from __future__ import annotations

import math

import pytest
import torch
from tests.llm.test_llm_quant import QUANT_CONFIG

from kiln.config.errors import ConfigError
from kiln.llm.config import config_from_dict
from kiln.llm.quality import DRIFT_LEN, DRIFT_PROMPTS, drift_prompts, logit_drift, perplexity, read_ppl_tokens
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


class _Words:
    def encode(self, text):
        return [int(w[1:]) for w in text.split()]


def test_ppl_file_forms_and_errors(tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("1, 2,3\n4 5\n")
    assert read_ppl_tokens(ids, None, 256) == [1, 2, 3, 4, 5]
    text = tmp_path / "text.txt"
    text.write_text("w7 w8 w9")
    assert read_ppl_tokens(text, _Words(), 256) == [7, 8, 9]
    for content, tok, needle in (("w7 w8", None, "no tokenizer"), ("", None, "empty"), ("1 300", None, "vocabulary"),
                                 ("5", None, "at least 2")):
        bad = tmp_path / "bad.txt"
        bad.write_text(content)
        with pytest.raises(ConfigError, match=needle) as err:
            read_ppl_tokens(bad, tok, 256)
        assert err.value.key == "--ppl-file"
    with pytest.raises(ConfigError, match="cannot read"):
        read_ppl_tokens(tmp_path / "missing.txt", None, 256)


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


def test_ppl_from_a_prepared_directory(tmp_path):
    import numpy as np

    from kiln.data.prepare import PrepareOptions, prepare

    (tmp_path / "t.txt").write_text("".join(f"Line {i} of the text.\n" for i in range(400)))
    prepare(PrepareOptions(inputs=[str(tmp_path / "t.txt")], out=tmp_path / "d", train_bpe=300, val_fraction=0.1))
    val = np.fromfile(tmp_path / "d" / "val.bin", dtype=np.uint16)
    assert read_ppl_tokens(tmp_path / "d", None, 300) == val.tolist()
    with pytest.raises(ConfigError, match="outside the model's vocabulary"):
        read_ppl_tokens(tmp_path / "d", None, int(val.max()))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="without meta.json"):
        read_ppl_tokens(tmp_path / "empty", None, 300)
    prepare(PrepareOptions(inputs=[str(tmp_path / "t.txt")], out=tmp_path / "d0", train_bpe=300, val_fraction=0))
    with pytest.raises(ConfigError, match="no validation split"):
        read_ppl_tokens(tmp_path / "d0", None, 300)
