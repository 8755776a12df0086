"""Features applied to kiln's decoder from outside: activation checkpointing, attention kernel,
float8 refusal, the fused cross-entropy inside a model."""

from __future__ import annotations

import pytest
import torch

from kiln.config.schema import ModelConfig
from kiln.errors import ConfigError
from kiln.models import build_model
from kiln.train.activation_checkpoint import apply_activation_checkpointing
from kiln.train.attention import choose_attention
from kiln.train.cross_entropy import hidden_state_loss
from kiln.train.float8 import check_float8
from kiln.train.losses import build_forward_loss


def _tiny(**kwargs):
    torch.manual_seed(0)
    return build_model(ModelConfig(name="llama:llama-tiny", kwargs=kwargs))


def _grads(built, tokens, targets, loss_fn=None):
    model = built.module
    model.zero_grad(set_to_none=True)
    loss = (loss_fn or build_forward_loss(model, "causal_lm"))(tokens, targets)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _batch(seed=1, batch=2, length=24, vocab=512):
    g = torch.Generator().manual_seed(seed)
    window = torch.randint(vocab, (batch, length + 1), generator=g)
    return window[:, :-1], window[:, 1:]


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_gives_equal_gradients(mode):
    tokens, targets = _batch()
    ref_loss, ref = _grads(_tiny(), tokens, targets)
    built = _tiny()
    assert apply_activation_checkpointing(built.blocks, mode) == len(built.blocks) == 2
    keys_before = set(built.module.state_dict())
    loss, got = _grads(built, tokens, targets)
    assert set(built.module.state_dict()) == keys_before  # checkpoints and export see the same names
    assert torch.equal(loss, ref_loss)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=0, atol=1e-6, msg=name)


def test_selective_checkpointing_recomputes_less_than_full():
    """`selective` keeps matmul outputs: backward recomputes no matmul, `full` recomputes all."""
    from torch.utils.flop_counter import FlopCounterMode

    tokens, targets = _batch()
    flops = {}
    for mode in ("none", "full", "selective"):
        built = _tiny()
        apply_activation_checkpointing(built.blocks, mode)
        with FlopCounterMode(display=False) as counter:
            build_forward_loss(built.module, "causal_lm")(tokens, targets).backward()
        flops[mode] = counter.get_total_flops()
    assert flops["selective"] == flops["none"] < flops["full"]


def test_fused_cross_entropy_in_the_model_equals_plain():
    tokens, targets = _batch()
    ref_loss, ref = _grads(_tiny(), tokens, targets)
    built = _tiny()
    loss, got = _grads(built, tokens, targets, hidden_state_loss(built.module, "chunked"))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-6, msg=name)


def test_tied_output_head_gets_both_gradients():
    tokens, targets = _batch()
    ref_loss, ref = _grads(_tiny(tie_word_embeddings=True), tokens, targets)
    built = _tiny(tie_word_embeddings=True)
    assert built.module.lm_head.weight is built.module.embed.weight
    loss, got = _grads(built, tokens, targets, hidden_state_loss(built.module, "chunked"))
    torch.testing.assert_close(got["embed.weight"], ref["embed.weight"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_refused_on_cpu(recipe):
    with pytest.raises(ConfigError, match=r"precision.float8.*CUDA GPU.*cpu"):
        check_float8(recipe, torch.device("cpu"), "bf16-mixed")
    check_float8("none", torch.device("cpu"), "fp32")  # off: nothing to check


def test_attention_choice_is_reported_and_bad_kernels_refused():
    built = _tiny()
    att = choose_attention(built.module, "math", device=torch.device("cpu"), dtype=torch.float32, seq_len=32)
    assert att == {"requested": "math", "kernel": "math", "expand_kv": False}
    with pytest.raises(ConfigError, match="model.attention.*'cudnn'.*cpu"):
        choose_attention(built.module, "cudnn", device=torch.device("cpu"), dtype=torch.float32, seq_len=32)


def test_expanded_key_value_heads_give_the_same_attention():
    built = _tiny()
    tokens, _ = _batch()
    with torch.no_grad():
        ref = built.module(tokens)
        for layer in built.module.layers:
            layer.attn.expand_kv = True
        torch.testing.assert_close(built.module(tokens), ref, rtol=1e-5, atol=1e-5)


def test_float8_converts_the_block_linears_only():
    pytest.importorskip("torchao.float8")
    from kiln.train.float8 import apply_float8

    built = _tiny()
    keys = set(built.module.state_dict())
    assert apply_float8(built.module, built.blocks, "rowwise") == 8  # wqkv, wo, w_gate_up, w_down per block
    converted = {type(m).__name__ for b in built.blocks for m in b.modules() if "Linear" in type(m).__name__}
    assert converted == {"Float8Linear"}
    assert type(built.module.lm_head) is torch.nn.Linear  # the logits stay in bf16
    assert set(built.module.state_dict()) == keys  # checkpoints and export see the same tensors
