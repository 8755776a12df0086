"""int4@gemlite's layer over kiln's int4 layout (kiln.llm.int4_gemlite): what it hands gemlite's op,
and its CPU path. gemlite itself needs a CUDA device to import; its kernels are checked on a GPU
(benchmarks/int4_gemm_bench.py's rel_err and packing check)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")  # kiln's int4 layout module registers Triton kernels

from kiln.errors import ConfigError  # noqa: E402
from kiln.llm import int4_gemlite  # noqa: E402
from kiln.llm.int4_gemlite import (  # noqa: E402
    GEMLITE_KERNELS,
    Int4GemliteLinear,
    gemlite_missing,
    kernel_index,
    meta_args,
)
from kiln.llm.int4_layout import Int4TritonLinear  # noqa: E402
from kiln.llm.quant import QuantSpec, check_quant, dequantized_reference, quantize_decoder  # noqa: E402


def test_meta_args_describe_kilns_layout_in_gemlites_order():
    # scaled activations, bits, group, mask, values per word, input/output dtype, accumulator, scale
    # dtype, channel scale mode, W_group_mode 4 (q * scale + zero), contiguous weight
    assert meta_args(128, torch.bfloat16) == [0, 4, 128, 15, 8, 2, 2, 0, 2, 0, 4, 1]
    assert meta_args(64, torch.float16) == [0, 4, 64, 15, 8, 1, 1, 0, 1, 0, 4, 1]


def test_kernel_index_is_gemlites_matmul_type():
    assert [kernel_index(k) for k in GEMLITE_KERNELS] == [-1, 0, 1, 2, 3, 4]


def test_layer_holds_int4_triton_tensors_and_computes_with_them_on_cpu():
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 48, bias=True).requires_grad_(False)
    layer = Int4GemliteLinear.from_linear(lin, 64)
    own = Int4TritonLinear.from_linear(lin, 64)
    assert torch.equal(layer.weight, own.weight) and layer.weight.dtype == torch.int32
    assert torch.equal(layer.scale, own.scale) and torch.equal(layer.offset, own.offset)
    assert torch.equal(layer.dequantize(), own.dequantize())
    x = torch.randn(3, 5, 256)
    assert torch.equal(layer(x), F.linear(x, own.dequantize(), lin.bias))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_gemlite_is_missing_without_cuda():
    assert "CUDA" in gemlite_missing()


@pytest.fixture(scope="module")
def config():
    from kiln.llm.config import config_from_dict

    return config_from_dict({"model_type": "llama", "vocab_size": 64, "hidden_size": 128, "intermediate_size": 256,
                             "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                             "max_position_embeddings": 64})


@pytest.mark.parametrize(("device", "dtype", "needle"), [
    ("cpu", torch.float32, "CUDA with fp16/bf16, not cpu float32"),
    ("cpu", torch.bfloat16, "CUDA with fp16/bf16, not cpu bfloat16"),
    ("cuda", torch.float32, "CUDA with fp16/bf16, not cuda float32"),
])
def test_int4_gemlite_where_it_cannot_run_names_quant(config, device, dtype, needle):
    with pytest.raises(ConfigError) as err:
        check_quant(QuantSpec("int4", backend="gemlite"), config, device, dtype)
    assert err.value.key == "--quant" and needle in str(err.value), str(err.value)


def test_int4_gemlite_without_gemlite_gives_the_install_hint(config, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(int4_gemlite, "load_gemlite", lambda: (_ for _ in ()).throw(ImportError("No module named 'gemlite'")))
    with pytest.raises(ConfigError) as err:
        check_quant(QuantSpec("int4", backend="gemlite"), config, "cuda", torch.bfloat16)
    assert err.value.key == "--quant" and "No module named 'gemlite'" in str(err.value)
    assert "pip install 'kiln[gemlite]'" in str(err.value)


def test_int8_at_gemlite_is_kilns_torch_layer(config):
    assert check_quant(QuantSpec("int8", backend="gemlite"), config, "cpu", torch.float32).backend == "torch"


def test_quantized_decoder_swaps_every_projection_for_the_gemlite_layer(config):
    from kiln.llm.weights import random_decoder

    model = random_decoder(config, device="cpu", dtype=torch.float32, seed=0)
    spec = QuantSpec("int4", backend="gemlite", group_size=64)
    quantized = quantize_decoder(model, spec)
    layers = [m for m in quantized.modules() if isinstance(m, Int4GemliteLinear)]
    assert len(layers) == 4 * config.n_layers + 1  # wqkv, wo, w_gate_up, w_down per block, and the head
    tokens = torch.tensor([[1, 5, 9, 3]])
    reference = dequantized_reference(model, quantized, spec)
    assert torch.allclose(quantized(tokens), reference(tokens), atol=1e-5)


def test_a_keys_first_call_is_made_twice_and_the_second_kept():
    """gemlite's autotuning reruns a split-K kernel into the first call's output; a stand-in op that
    triples its first result per key shows kiln's op returns the clean second call, once tuned one
    call; and the op compiles whole."""
    if hasattr(torch.ops.gemlite, "forward_functional"):
        pytest.skip("gemlite's real op is registered in this process")
    calls, seen = [], set()

    @torch.library.custom_op("gemlite::forward_functional", mutates_args=())
    def stand_in(x: torch.Tensor, bias: torch.Tensor | None, tensor_args: list[torch.Tensor], meta_args: list[int],
                 matmul_type: int = -1) -> torch.Tensor:
        weight, scale, offset, _ = tensor_args
        layer = Int4GemliteLinear(weight, scale, offset, None, group_size=meta_args[2])
        key = (x.shape[0], matmul_type)
        calls.append(key)
        y = x @ layer.dequantize(x.dtype).t()
        first = key not in seen
        seen.add(key)
        return 3 * y if first else y

    torch.manual_seed(0)
    layer = Int4GemliteLinear.from_linear(torch.nn.Linear(256, 48, bias=False).requires_grad_(False), 64)
    x = torch.randn(4, 256)
    exact = x @ layer.dequantize().t()
    args = (layer.weight, layer.scale, layer.offset, layer.meta_scale, 64, kernel_index("GEMM_SPLITK"))
    assert torch.equal(torch.ops.kiln.gemlite_int4(x, *args), exact) and calls == [(4, 3), (4, 3)]
    assert torch.equal(torch.ops.kiln.gemlite_int4(x, *args), exact) and len(calls) == 3
    one = x[:1]
    assert torch.equal(torch.ops.kiln.gemlite_int4(one, *args), one @ layer.dequantize().t()) and len(calls) == 5
    # its fake implementation lets torch.compile trace it whole (shape, dtype) and the graph call it
    torch.library.opcheck(torch.ops.kiln.gemlite_int4, (x, *args))
    compiled = torch.compile(lambda v: torch.ops.kiln.gemlite_int4(v, *args), backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), exact)


def test_rows_go_to_kilns_one_row_kernel_then_gemlite_then_the_dequantized_weight():
    """Below GEMLITE_FROM rows kiln's one-row kernel (measured faster than gemlite's GEMV kernels at
    1 and 4 rows), gemlite up to GEMLITE_UP_TO, the dequantized weight above; a named kernel is gemlite's
    at every row count it takes."""
    first = int4_gemlite.GEMLITE_FROM
    assert [int4_gemlite.gemlite_path(r, "auto") for r in (1, first - 1, first, int4_gemlite.GEMLITE_UP_TO,
                                                  int4_gemlite.GEMLITE_UP_TO + 1)] == ["matvec", "matvec", "gemlite", "gemlite",
                                                                             "dequant"]
    assert int4_gemlite.gemlite_path(1, "GEMV") == "gemlite" and int4_gemlite.gemlite_path(int4_gemlite.GEMLITE_UP_TO + 1, "GEMV") == "dequant"
