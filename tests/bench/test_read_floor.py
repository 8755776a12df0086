"""benchmarks/read_floor.py's step reads: each projection's bytes are what kiln's decoder stores
(bf16, and kiln's int4 layout as quantized), the keys and values what the bench's formula counts."""

from __future__ import annotations

import torch

from kiln.bench.formulas import attended_kv_bytes
from kiln.llm.config import config_from_dict
from kiln.llm.int4_layout import Int4TritonLinear
from kiln.llm.weights import random_decoder, tensor_nbytes

from ..benchmark_scripts import load_script

floor = load_script("read_floor")
CONFIG = {"model_type": "llama", "vocab_size": 384, "hidden_size": 256, "intermediate_size": 384,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 128, "tie_word_embeddings": False}
PROJECTIONS = ("attn.wqkv", "attn.wo", "ffn.w_gate_up", "ffn.w_down")


def _module_bytes(module) -> int:
    return sum(tensor_nbytes(t) for t in (*module.parameters(), *module.buffers()))


def test_reads_are_the_decoders_own_bytes_in_step_order():
    config = config_from_dict(CONFIG)
    model = random_decoder(config, device="cpu", dtype=torch.float32, seed=0)
    layer = model.layers[1]
    for quant in ("none", "int4"):  # int4: each projection as int4@triton stores it (kiln's layout, groups of 128)
        as_read = (lambda m: m) if quant == "none" else (lambda m: Int4TritonLinear.from_linear(m, 128))
        reads = floor.step_reads(config, quant, slots=40, dtype_bytes=4)
        assert [r.kind for r in reads] == [*["attn.wqkv", "kv", "attn.wo", "ffn.w_gate_up", "ffn.w_down"] * 2, "lm_head"]
        stored = {name: _module_bytes(as_read(layer.get_submodule(name))) for name in PROJECTIONS}
        assert {r.kind: r.nbytes for r in reads[5:10] if r.kind != "kv"} == stored
        assert reads[-1].nbytes == _module_bytes(as_read(model.lm_head))
        kv = sum(r.nbytes for r in reads if r.kind == "kv")
        assert kv == attended_kv_bytes(lengths=[39], first_step=1, last_step=1, n_layers=2, kv_heads=2,
                                       head_dim=64, dtype_bytes=4)
    # int4: 4 bits a weight plus a scale and an offset per 128 inputs
    assert floor.weight_bytes(256, 3072, "int4", 2) == 256 * 3072 // 2 + 2 * 24 * 256 * 2
    assert floor.weight_bytes(256, 3072, "none", 2) == 256 * 3072 * 2
