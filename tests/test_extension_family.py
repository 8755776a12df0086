"""docs/extension.md's "Add a model family", followed step by step: a toy family (Llama attention,
a GELU MLP of two matrices instead of the SwiGLU one) written as one module of a temporary
package, registered with one line (monkeypatch undoes it), then run on CPU through every seam the
spec feeds: config parsing, the builder, a forward and a generation, a `kiln train` run with
`model.name=llama:<its preset>`, `kiln export` and loading the export back (the HF name map both
ways), quantization, and the kernels it does and does not take.
"""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
import torch

from kiln.config import load_config
from kiln.errors import ConfigError
from kiln.llm.config import config_from_dict, resolve_model
from kiln.llm.engine import Engine
from kiln.llm.families import FAMILIES
from kiln.llm.kernels import TritonRopeDecodeAttention, use_decode_kernels
from kiln.llm.quant import QuantSpec, check_quant, quantize_decoder
from kiln.llm.weights import build_decoder, load_hf_state_dict, random_decoder, to_hf_state_dict
from kiln.models.registry import known_models
from kiln.train.swiglu import apply_swiglu_kernel, resolve_swiglu_kernel

# Step 1 of the doc: one module holding the family's module classes and its spec.
TOY_FAMILY = '''
"""A toy family: Llama attention, a GELU MLP (up, down) in place of the SwiGLU one."""

from dataclasses import replace

import torch.nn.functional as F
from torch import nn

from kiln.llm import llama_family
from kiln.llm.family import FamilySpec
from kiln.llm.model import Block, Decoder


class GeluMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w_up = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.w_down = nn.Linear(config.ffn_dim, config.dim, bias=False)

    def forward(self, x):
        return self.w_down(F.gelu(self.w_up(x)))


class ToyBlock(Block):
    ffn_class = GeluMLP


class ToyDecoder(Decoder):
    block_class = ToyBlock


def parse_config(raw, key):
    return replace(llama_family.parse_config({**raw, "model_type": "llama"}, key), family="toy")


def hf_names(config):
    names = {k: v for k, v in llama_family.hf_names(config).items() if ".ffn.w_gate_up." not in k}
    for i in range(config.n_layers):
        names[f"layers.{i}.ffn.w_up.weight"] = (f"model.layers.{i}.mlp.up_proj.weight",)
    return names


def projections(config):
    shapes = llama_family.projections(config)
    del shapes["ffn.w_gate_up"]
    return {**shapes, "ffn.w_up": (config.ffn_dim, config.dim)}


TOY_TINY = {"model_type": "toy", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2}

TOY = FamilySpec(
    name="toy", parse_config=parse_config, build=ToyDecoder, hf_names=hf_names,
    hf_splits=llama_family.hf_splits, projections=projections, hf_architecture="ToyForCausalLM",
    config_fields=llama_family.CONFIG_FIELDS, presets={"toy-tiny": TOY_TINY},
    kernels=frozenset({"decode_attention"}),
)
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy family's module, imported from a temporary package and registered (step 2: one line)."""
    package = tmp_path / "toy_kiln_families"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "toy.py").write_text(textwrap.dedent(TOY_FAMILY))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("toy_kiln_families.toy")
    monkeypatch.setitem(FAMILIES, "toy", module.TOY)
    yield module
    for name in [n for n in sys.modules if n.startswith("toy_kiln_families")]:
        del sys.modules[name]


def test_an_unregistered_family_is_refused_naming_the_registered_ones():
    with pytest.raises(ConfigError, match="model_type 'toy' is not a decoder kiln runs.*llama"):
        config_from_dict({"model_type": "toy", "hidden_size": 64})


def test_the_toy_family_builds_runs_and_generates(toy):
    config = config_from_dict(toy.TOY_TINY)
    assert config.family == "toy" and "llama:toy-tiny" in known_models()
    model = random_decoder(config, device="cpu", dtype=torch.float32, seed=0)
    assert type(model) is toy.ToyDecoder and all(isinstance(b.ffn, toy.GeluMLP) for b in model.layers)
    tokens = torch.tensor([[1, 5, 9, 17, 33]])
    logits = model(tokens)
    assert logits.shape == (1, 5, 256) and torch.isfinite(logits).all()

    # A generation through the static-cache engine is the greedy continuation the plain forward gives.
    out = Engine(model).generate(tokens.tolist(), max_new_tokens=6)
    sequence = tokens
    for _ in range(6):
        sequence = torch.cat([sequence, model(sequence)[:, -1:].argmax(-1)], dim=1)
    assert out.tokens[0] == sequence[0, 5:].tolist()


def test_the_hf_name_map_round_trips(toy):
    config = config_from_dict(toy.TOY_TINY)
    model = random_decoder(config, device="cpu", dtype=torch.float32, seed=0)
    hf = to_hf_state_dict(model.state_dict(), config)
    assert "model.layers.1.mlp.up_proj.weight" in hf and not any("gate_proj" in k for k in hf)
    again = load_hf_state_dict(random_decoder(config, device="cpu", dtype=torch.float32, seed=1), hf)
    assert all(v.equal(model.state_dict()[k]) for k, v in again.state_dict().items())
    with pytest.raises(ConfigError, match="lacks"):
        load_hf_state_dict(again, {k: v for k, v in hf.items() if "up_proj" not in k})


def test_kiln_train_runs_the_toy_family_and_its_export_loads_back(toy, tmp_path):
    from kiln.cli.main import main
    from kiln.train.trainer import train

    over = ["model.name=llama:toy-tiny", "model.kwargs.num_hidden_layers=1", "data.batch_size=2",
            "data.seq_len=16", "data.synthetic_samples=16", "training.steps=2", "training.log_interval=1",
            "training.device=cpu", "optim.lr=3e-3", "metrics.console=false", "metrics.tensorboard=false",
            "checkpoint.interval=2"]
    summary = train(load_config(None, over), tmp_path / "run")
    assert summary["status"] == "completed" and summary["features"]["swiglu_kernel"] == "plain"
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    source = resolve_model(str(tmp_path / "hf"))
    assert source.raw["architectures"] == ["ToyForCausalLM"] and source.config.n_layers == 1
    loaded = build_decoder(source, device="cpu", dtype=torch.float32)
    assert type(loaded) is toy.ToyDecoder
    assert loaded(torch.tensor([[1, 2, 3]])).shape == (1, 3, 256)


def test_quantization_and_kernels_follow_the_spec(toy):
    config = config_from_dict(toy.TOY_TINY)
    model = random_decoder(config, device="cpu", dtype=torch.float32, seed=0)
    spec = check_quant(QuantSpec("int8", backend="torch"), config, "cpu", torch.float32)
    quantized = quantize_decoder(model, spec)
    assert all(type(b.ffn.w_up).__name__ == "Int8WeightOnlyLinear" for b in quantized.layers)
    assert quantized(torch.tensor([[1, 2, 3]])).shape == (1, 3, 256)
    with pytest.raises(ConfigError, match="int4@triton.*toy"):
        check_quant(QuantSpec("int4", backend="triton"), config, "cpu", torch.float32)

    # No SwiGLU MLP: the fused SwiGLU kernel does not apply; kiln's decode attention does.
    cpu = torch.device("cpu")
    assert resolve_swiglu_kernel("auto", model, torch.device("cuda")) == "plain"
    with pytest.raises(ConfigError, match="training.swiglu_kernel"):
        resolve_swiglu_kernel("fused", model, cpu)
    assert apply_swiglu_kernel(model, "fused") == 0
    with pytest.raises(ValueError, match="toy models do not take kiln's decode_matvec"):
        use_decode_kernels(model, matvec="triton")
    use_decode_kernels(model, attention="triton")
    assert all(isinstance(b.attn, TritonRopeDecodeAttention) and type(b) is toy.ToyBlock for b in model.layers)
    use_decode_kernels(model)
    assert type(model) is toy.ToyDecoder and all(type(b.attn).__name__ == "Attention" for b in model.layers)
