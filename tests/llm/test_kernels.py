"""kiln.llm.kernels.use_decode_kernels on CPU: the plain model has no kernel branches; swapping the
kernels in changes which class runs each decode step and nothing else (parameters, state dict,
prompt logits bitwise, decode logits with the CPU fallbacks bitwise); it swaps back; the engine
applies it. The kernels themselves against the plain model: test_decode_attention.py (flash, with
a reference of its varlen call) and the interpreter tests in test_triton_decode.py and
test_triton_matvec.py (through conftest.assert_decode_matches_matmul)."""

from __future__ import annotations

import ast
import copy
import inspect

import pytest
import torch

from kiln.llm import Engine, build_decoder, resolve_model
from kiln.llm import model as plain
from kiln.llm.kernels import (
    FlashDecodeAttention,
    FusedMatvecBlock,
    FusedMatvecDecoder,
    TritonDecodeAttention,
    TritonRopeDecodeAttention,
    use_decode_kernels,
)
from kiln.llm.model import Attention, AttentionInputs, Block, Decoder, KVCache

from .conftest import transformers  # noqa: F401  (skips without it)

KERNEL_WORDS = ("triton", "flash", "matvec", "kernel", "fused", "rows")


def _model(checkpoints, family: str) -> Decoder:
    return build_decoder(resolve_model(str(checkpoints[family])), device="cpu", dtype=torch.float32)


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_forward_signatures_take_only_what_a_single_device_decoder_needs():
    assert _params(Decoder.forward) == ["self", "tokens", "cache", "pad", "decode_slot", "last_only", "hidden"]
    assert _params(Block.forward) == ["self", "x", "inputs", "kv"]
    assert _params(Attention.forward) == ["self", "x", "inputs", "kv"]
    assert _params(Attention.core) == ["self", "qkv", "inputs", "kv"]
    fields = list(inspect.signature(AttentionInputs).parameters)
    assert fields == ["cos", "sin", "masks", "slot", "pad", "inv_freq"]


def test_the_model_file_names_no_kernel():
    """No import of a kernel module, and no identifier or string (docstrings aside) naming one."""
    tree = ast.parse(inspect.getsource(plain))
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert sorted(m for m in imported if m.startswith("kiln")) == ["kiln.llm.decoder_config", "kiln.llm.rope"]
    docstrings = {id(n.value) for n in ast.walk(tree)  # of the module, classes, functions and fields
                  if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
    words = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)]
    words += [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)]
    words += [n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)]
    words += [n.value for n in ast.walk(tree)
              if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]
    assert [w for w in words if any(k in w.lower() for k in KERNEL_WORDS)] == []


@pytest.mark.parametrize("attention,matvec", [("matmul", "triton"), ("flash", "inductor"), ("triton", "triton")])
def test_swapping_keeps_the_weights_and_the_prompt_logits(checkpoints, attention, matvec):
    """Prompts (prefill, training) run the plain code: bitwise the same logits and hidden states."""
    model = _model(checkpoints, "llama3-tied")
    swapped = use_decode_kernels(copy.deepcopy(model), attention=attention, matvec=matvec)
    before, after = model.state_dict(), swapped.state_dict()
    assert list(before) == list(after) and all(torch.equal(before[k], after[k]) for k in before)
    tokens = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(1))
    pad = torch.tensor([0, 3])
    with torch.no_grad():
        assert torch.equal(swapped(tokens), model(tokens))
        assert torch.equal(swapped(tokens, pad=pad, last_only=True), model(tokens, pad=pad, last_only=True))
        assert torch.equal(swapped(tokens, hidden=True), model(tokens, hidden=True))


@pytest.mark.parametrize("family", ["llama-untied", "qwen3", "mistral"])
def test_fused_matvec_decode_falls_back_to_the_same_math_on_cpu(checkpoints, family):
    """Without a GPU (or Triton's interpreter) the fused calls compute the plain modules' math:
    every decode step's logits and the cache it leaves are bitwise the plain model's."""
    model = _model(checkpoints, family)
    swapped = use_decode_kernels(copy.deepcopy(model), matvec="triton")
    tokens = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    pad = torch.tensor([0, 2])
    caches = [KVCache(model.config, 2, 14, dtype=torch.float32, device="cpu") for _ in range(2)]
    with torch.no_grad():
        for m, cache in zip((model, swapped), caches):
            m(tokens[:, :7], cache=cache, pad=pad)
        for t in range(7, 12):
            step = [m(tokens[:, t:t + 1], cache=c, pad=pad, decode_slot=torch.tensor([t]))
                    for m, c in zip((model, swapped), caches)]
            assert torch.equal(step[0], step[1])
    assert all(torch.equal(a, b) for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v))


def test_each_layer_gets_the_kernel_that_serves_it(checkpoints):
    """flash leaves Mistral's windowed layers on the matmul path; triton fuses RoPE and the cache
    write only where there are no q/k norms (qwen3 has them)."""
    mistral = use_decode_kernels(_model(checkpoints, "mistral"), attention="flash")
    assert [type(b.attn) for b in mistral.layers] == [
        FlashDecodeAttention if b.attn.window is None else Attention for b in mistral.layers]
    assert any(b.attn.window is not None for b in mistral.layers)
    qwen3 = use_decode_kernels(_model(checkpoints, "qwen3"), attention="triton", matvec="triton")
    assert {type(b.attn) for b in qwen3.layers} == {TritonDecodeAttention}
    assert {type(b) for b in qwen3.layers} == {FusedMatvecBlock} and type(qwen3) is FusedMatvecDecoder
    llama = use_decode_kernels(_model(checkpoints, "llama3-tied"), attention="triton")
    assert {type(b.attn) for b in llama.layers} == {TritonRopeDecodeAttention}
    assert {type(b) for b in llama.layers} == {Block} and type(llama) is Decoder


def test_swapping_back_restores_the_plain_classes(checkpoints):
    model = use_decode_kernels(_model(checkpoints, "qwen3"), attention="triton", matvec="triton")
    assert use_decode_kernels(model) is model
    assert type(model) is Decoder
    assert {type(b) for b in model.layers} == {Block} and {type(b.attn) for b in model.layers} == {Attention}


def test_bad_choices_and_models_are_refused(checkpoints):
    model = _model(checkpoints, "qwen2")
    with pytest.raises(ValueError, match=r"attention must be one of matmul, flash, triton, got 'auto'"):
        use_decode_kernels(model, attention="auto")
    with pytest.raises(ValueError, match=r"matvec must be one of inductor, triton, got 'cuda'"):
        use_decode_kernels(model, matvec="cuda")
    with pytest.raises(TypeError, match="kiln's plain Decoder"):
        use_decode_kernels(torch.nn.Linear(2, 2))
    assert type(model) is Decoder and {type(b.attn) for b in model.layers} == {Attention}


def test_engine_swaps_its_choice_in(checkpoints):
    """On CPU `auto` resolves to the plain paths: an engine leaves (or puts back) the plain classes."""
    model = use_decode_kernels(_model(checkpoints, "llama3-tied"), attention="triton", matvec="triton")
    engine = Engine(model)
    assert (engine.decode_kernel, engine.decode_matvec) == ("matmul", "inductor")
    assert type(model) is Decoder and {type(b.attn) for b in model.layers} == {Attention}


def test_attention_inputs_are_built_once_per_call(checkpoints, monkeypatch):
    """One AttentionInputs per forward call, the same object in every layer."""
    model = _model(checkpoints, "mistral")
    built, seen = [], []
    original = Decoder.attention_inputs

    def counting(self, *args):
        built.append(original(self, *args))
        return built[-1]

    monkeypatch.setattr(Decoder, "attention_inputs", counting)
    for block in model.layers:
        block.register_forward_pre_hook(lambda module, args: seen.append(args[1]))
    cache = KVCache(model.config, 1, 8, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        model(torch.tensor([[3, 4, 5]]), cache=cache)
        model(torch.tensor([[6]]), cache=cache, decode_slot=torch.tensor([3]))
    assert len(built) == 2 and not built[0].decoding and built[1].decoding
    n = len(model.layers)
    assert len(seen) == 2 * n and all(s is built[0] for s in seen[:n]) and all(s is built[1] for s in seen[n:])
    assert set(built[1].masks) == {b.attn.window for b in model.layers}
