"""Weight-only quantization of kiln's decoder (kiln.llm.quant): layers, backends, bytes, checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from kiln.errors import ConfigError
from kiln.llm import quant as quant_mod
from kiln.llm.config import config_from_dict
from kiln.llm.engine import Engine
from kiln.llm.quality import DRIFT_BOUNDS, drift_prompts, judge_drift, judge_quantized, logit_drift
from kiln.llm.quant import QuantSpec, check_quant, dequantized_reference, parse_quant, quantize_decoder
from kiln.llm.quant_torch import Int4FusedLinear, Int4WeightOnlyLinear, Int8WeightOnlyLinear, int4_reference
from kiln.llm.weights import decode_weight_bytes, random_decoder, tensor_nbytes

# Dims that every kernel takes: inputs 128 and 256 (int4 groups of 32..128; 64 for the inductor
# layout's two halves), 8-aligned outputs; tied embeddings, GQA. A larger init than HF's 0.02 gives
# logits as spread as the 3B preset's (std ~1.1), so the KL bound is as sensitive here as there.
QUANT_CONFIG = {"model_type": "llama", "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 256, "tie_word_embeddings": True, "initializer_range": 0.1}


@pytest.fixture(scope="module")
def config():
    return config_from_dict(QUANT_CONFIG)


@pytest.fixture(scope="module")
def model(config):
    return random_decoder(config, device="cpu", dtype=torch.float32, seed=0)


def _torchao_or_skip():
    reason = quant_mod.torchao_missing()
    if reason:
        pytest.skip(f"torchao CPU path not testable here: {reason}")


def test_int8_layer_is_per_channel_symmetric():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 16, bias=True).requires_grad_(False)
    q = Int8WeightOnlyLinear.from_linear(lin)
    assert q.weight.dtype == torch.int8 and q.scale.shape == (16,) and q.weight.abs().max() <= 127
    assert torch.allclose(q.dequantize(), lin.weight, atol=float(lin.weight.abs().max()) / 254 + 1e-7)
    x = torch.randn(3, 64)
    assert torch.allclose(q(x), F.linear(x, q.dequantize(), lin.bias), atol=1e-5)
    grouped = Int8WeightOnlyLinear.from_linear(lin, group_size=16)
    assert grouped.scale.shape == (16, 4)
    assert (grouped.dequantize() - lin.weight).abs().max() <= (q.dequantize() - lin.weight).abs().max() + 1e-7


@pytest.mark.parametrize("cls", [Int4WeightOnlyLinear, Int4FusedLinear])
def test_int4_layers_compute_with_the_dequantized_groups(cls):
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 48, bias=False).requires_grad_(False)
    q = cls.from_linear(lin, 64)
    ref = int4_reference(lin, 64)
    assert (ref - lin.weight).abs().max() <= float(lin.weight.abs().max()) / 15 * 1.01  # half a step of 2 max / 15
    for shape in ((1, 1, 256), (2, 5, 256)):  # one token (decode) and a prompt
        x = torch.randn(shape)
        assert torch.allclose(q(x), F.linear(x, ref), atol=1e-4), (cls.__name__, shape)
    packed = {n: b for n, b in q.named_buffers()}
    assert sum(tensor_nbytes(b) for b in packed.values()) < 0.3 * lin.weight.numel() * 4


@pytest.mark.parametrize(("entry", "group", "library", "kl_bound"), [
    ("int8@torch", None, "torch", DRIFT_BOUNDS["int8"]),
    ("int4@torch", None, "torch", DRIFT_BOUNDS["int4"]),
    ("int4@inductor", 64, "inductor", DRIFT_BOUNDS["int4"]),
])
def test_quantized_copy_drifts_within_its_bound_and_leaves_the_model_alone(model, config, entry, group, library,
                                                                          kl_bound):
    spec = check_quant(parse_quant(entry, QuantSpec(group_size=group)), config, "cpu", torch.float32)
    assert spec.library == library
    before = {n: p.clone() for n, p in model.named_parameters()}
    q = quantize_decoder(model, spec)
    assert q is not model and q.embed.weight is model.embed.weight  # shared, not copied
    assert model.lm_head.weight is model.embed.weight and isinstance(model.lm_head, torch.nn.Linear)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    drift = logit_drift(q, model, drift_prompts(config.vocab_size, config.max_positions))
    # top-1 agreement of random weights is low for 4 bits (no structure to hide the rounding in);
    # chance would be 1/256
    assert 0 < drift["drift_kl"] <= kl_bound and drift["drift_top1"] > (0.9 if spec.kind == "int8" else 0.3), drift
    assert judge_drift(spec.kind, drift) == (kl_bound, True)
    # The kernels compute exactly their own rounding: against plain matmuls on the dequantized weights
    # the logits differ by float rounding only.
    fidelity = logit_drift(q, dequantized_reference(model, q, spec), drift_prompts(config.vocab_size, 64))
    assert fidelity["drift_kl"] < 1e-6 and fidelity["drift_top1"] == 1.0, fidelity
    assert judge_quantized(spec.kind, drift, fidelity["drift_kl"], real_weights=True) is None
    # Decode reads fewer bytes: the quantized matrices plus the fp32 norms (embedding not read).
    bits = 8 if spec.kind == "int8" else 4
    assert decode_weight_bytes(q) < decode_weight_bytes(model) * (bits / 32) * 1.4


def test_quantized_model_runs_in_the_compiled_engine(model, config):
    spec = check_quant(QuantSpec("int4", backend="inductor", group_size=64), config, "cpu", torch.float32)
    q = quantize_decoder(model, spec)
    prompt = [[5, 17, 42, 9, 100, 3]]
    eager = Engine(q).generate(prompt, max_new_tokens=6).tokens
    engine = Engine(q, compile=True, compile_prefill=False)
    assert engine.generate(prompt, max_new_tokens=6).tokens == eager
    assert [name.split("[")[0] for name in engine.compiled] == ["decode"]  # prefill ran eagerly


def test_torchao_int8_on_cpu(model, config, monkeypatch):
    _torchao_or_skip()
    spec = check_quant(QuantSpec("int8"), config, "cpu", torch.float32)
    assert spec.library == "torchao"
    q = quantize_decoder(model, spec)
    weight = q.layers[0].attn.wqkv.weight
    assert is_traceable_wrapper_subclass(weight)  # torchao's tensor subclass, not a plain tensor
    inner = sum(tensor_nbytes(getattr(weight, n)) for n in weight.__tensor_flatten__()[0])
    assert tensor_nbytes(weight) == inner < weight.numel() * 4 / 3  # int8 data + per-row scales
    drift = logit_drift(q, model, drift_prompts(config.vocab_size, config.max_positions))
    assert drift["drift_kl"] <= DRIFT_BOUNDS["int8"] and drift["drift_top1"] > 0.9
    fidelity = logit_drift(q, dequantized_reference(model, q, spec), drift_prompts(config.vocab_size, 64))
    assert fidelity["drift_kl"] < 1e-6
    # A torchao tensor without dequantize (the int4 tinygemm one) is read back through its own matmul.
    expected = quant_mod._dequantized_weight(q.layers[0].attn.wqkv, model.layers[0].attn.wqkv, spec)

    def no_dequantize(self, *args, **kwargs):
        raise NotImplementedError

    monkeypatch.setattr(type(weight), "dequantize", no_dequantize)
    assert torch.equal(quant_mod._dequantized_weight(q.layers[0].attn.wqkv, model.layers[0].attn.wqkv, spec), expected)
    prompt = [[5, 17, 42, 9]]
    eager = Engine(q).generate(prompt, max_new_tokens=4).tokens
    assert Engine(q, compile=True).generate(prompt, max_new_tokens=4).tokens == eager


def test_nf4_through_bitsandbytes(model, config):
    missing = quant_mod.bitsandbytes_missing()
    if missing:
        pytest.skip(f"bitsandbytes not testable here: {missing}")
    spec = check_quant(QuantSpec("nf4"), config, "cpu", torch.float32)
    q = quantize_decoder(model, spec)
    assert spec.library == "bitsandbytes" and spec.group == 64
    drift = logit_drift(q, model, drift_prompts(config.vocab_size, config.max_positions))
    assert drift["drift_kl"] <= DRIFT_BOUNDS["nf4"]
    fidelity = logit_drift(q, dequantized_reference(model, q, spec), drift_prompts(config.vocab_size, 64))
    assert fidelity["drift_kl"] < 1e-3  # bitsandbytes' CPU kernel rounds differently from a plain matmul
    assert decode_weight_bytes(q) < decode_weight_bytes(model) * 0.2


def test_a_broken_quantization_is_caught_by_the_bound(model, config):
    spec = check_quant(QuantSpec("int8", backend="torch"), config, "cpu", torch.float32)
    q = quantize_decoder(model, spec)
    for block in q.layers:  # scales of the wrong output channels: what a layout bug does
        for layer in (block.attn.wqkv, block.attn.wo, block.ffn.w_gate_up, block.ffn.w_down):
            layer.scale.copy_(layer.scale.flip(0))
    drift = logit_drift(q, model, drift_prompts(config.vocab_size, config.max_positions))
    assert judge_drift("int8", drift) == (DRIFT_BOUNDS["int8"], False), drift
    # The stored format itself is wrong, so only the quality bound (real weights) can see it.
    fidelity = logit_drift(q, dequantized_reference(model, q, spec), drift_prompts(config.vocab_size, 64))
    assert "over the int8 bound" in judge_quantized("int8", drift, fidelity["drift_kl"], real_weights=True)
    assert judge_quantized("int8", drift, fidelity["drift_kl"], real_weights=False) is None


def test_a_kernel_that_computes_something_else_fails_fidelity_on_any_weights(model, config, monkeypatch):
    spec = check_quant(QuantSpec("int8", backend="torch"), config, "cpu", torch.float32)
    q = quantize_decoder(model, spec)
    reference = dequantized_reference(model, q, spec)
    # A kernel bug: scales applied to the wrong output channels (the stored format is right).
    monkeypatch.setattr(Int8WeightOnlyLinear, "forward",
                        lambda self, x: F.linear(x, self.weight.to(x.dtype)) * self.scale.flip(0))
    prompts = drift_prompts(config.vocab_size, 64)
    fidelity = logit_drift(q, reference, prompts)
    problem = judge_quantized("int8", logit_drift(q, model, prompts), fidelity["drift_kl"], real_weights=False)
    assert problem is not None and "kernel fidelity" in problem, fidelity


def test_unquantized_head_keeps_the_tie(model, config):
    spec = check_quant(QuantSpec("int8", backend="torch", lm_head=False), config, "cpu", torch.float32)
    q = quantize_decoder(model, spec)
    assert q.lm_head.weight is q.embed.weight and isinstance(q.layers[0].ffn.w_down, Int8WeightOnlyLinear)
    assert "head unquantized" in spec.describe()


@pytest.mark.parametrize(("spec", "flag", "needle"), [
    (QuantSpec("int3"), "--quant", "int8"),
    (QuantSpec("int8", backend="cuda"), "--quant-backend", "inductor"),
    (QuantSpec("int4", backend="torch", group_size=100), "--group-size", "128"),
    (QuantSpec("int4", backend="torch", group_size=256), "--group-size", "does not divide the 128 input features"),
    (QuantSpec("int8", backend="torch", group_size=96), "--group-size", "does not divide"),
    (QuantSpec("nf4", group_size=100), "--group-size", "4096"),
    (QuantSpec("int4", backend="torchao"), "--quant", "needs CUDA"),
    (QuantSpec("int4", backend="inductor", group_size=128), "--group-size", "2 x 128"),
])
def test_bad_specs_name_the_flag(config, spec, flag, needle):
    with pytest.raises(ConfigError) as err:
        check_quant(spec, config, "cpu", torch.float32)
    assert err.value.key == flag and needle in str(err.value), str(err.value)


def test_missing_torchao_is_a_config_error_with_the_install_hint(config, monkeypatch):
    monkeypatch.setattr(quant_mod, "torchao_missing", lambda: "torchao is not installed; pip install 'kiln[quant]'")
    with pytest.raises(ConfigError) as err:
        check_quant(QuantSpec("int8"), config, "cpu", torch.float32)
    assert err.value.key == "--quant" and "kiln[quant]" in str(err.value) and "--quant-backend torch" in str(err.value)
    # auto falls back to kiln's own layers instead
    assert check_quant(QuantSpec("int8", backend="auto"), config, "cpu", torch.float32).library == "torch"


def test_int4_on_cuda_needs_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    flag, reason = quant_mod._int4_device_problem(torch.device("cuda"), torch.float16, "torchao")
    assert flag == "--dtype" and "bf16" in reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    flag, reason = quant_mod._int4_device_problem(torch.device("cuda"), torch.bfloat16, "torch")
    assert flag == "--quant" and "8.0" in reason


@pytest.mark.parametrize(("entry", "needle"), [("nf4@torch", "no backend"), ("int4@tirton", "unknown backend")])
def test_quant_entries(entry, needle):
    assert parse_quant("int4@inductor", QuantSpec(backend="torchao")).backend == "inductor"
    assert parse_quant("int8", QuantSpec(backend="torch")).backend == "torch"
    with pytest.raises(ConfigError, match=needle):
        parse_quant(entry, QuantSpec())


def test_kernel_fidelity_also_runs_decode_sized_calls():
    """A decode kernel that is wrong only for the few rows of a decode step (prefill-sized inputs
    dequantize and call a plain matmul, identical to the reference) is caught: fidelity is the worse
    of the full prompts and their first `decode_rows` tokens."""
    from kiln.llm.quality import kernel_fidelity

    class Reference(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(32, 16)
            self.head = torch.nn.Linear(16, 32)

        def forward(self, tokens):
            return self.head(self.embed(tokens))

    class WrongOnFewRows(torch.nn.Module):
        def __init__(self, ref):
            super().__init__()
            self.ref = ref

        def forward(self, tokens):
            out = self.ref(tokens)
            return out + 3.0 * torch.arange(32.0) / 32 if tokens.numel() <= 8 else out

    torch.manual_seed(0)
    ref = Reference()
    prompts = torch.randint(0, 32, (4, 128))
    bad = kernel_fidelity(WrongOnFewRows(ref), ref, prompts, decode_rows=8)
    assert bad["fidelity_prompt_kl"] == 0.0 and bad["fidelity_decode_kl"] > 0.05
    assert bad["fidelity_kl"] == bad["fidelity_decode_kl"] and bad["fidelity_decode_rows"] == 8
    assert judge_quantized("int4", {"drift_kl": 0.0}, bad["fidelity_kl"], real_weights=False) is not None
    good = kernel_fidelity(ref, ref, prompts, decode_rows=8)
    assert good["fidelity_kl"] == 0.0 and good["fidelity_max_abs"] == 0.0
