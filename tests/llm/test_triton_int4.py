"""kiln's Triton int4 matmul (kiln.llm.triton_int4) on CPU through Triton's interpreter: the kernel
against the layer's own dequantized weight, several rows, a bias, shapes whose output count is
not a multiple of the block, and `int4@triton` through quantize_decoder. Triton picks its
interpreter when first imported, so the kernel tests run in a subprocess (`test_under_interpreter`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kiln.config.errors import ConfigError
from kiln.llm.quant import QuantSpec, check_quant, quantize_decoder

from .triton_interpreter import interpreted, not_in_subprocess, rerun_interpreted

ti = pytest.importorskip("kiln.llm.triton_int4", reason="Triton is not installed (pip install 'kiln[test]')")


@not_in_subprocess
def test_under_interpreter():
    rerun_interpreted(__file__)


@interpreted
@pytest.mark.parametrize("out_features,in_features,group,rows,bias", [
    (40, 256, 32, 1, False),   # 40 outputs: the last block is partial; 4 groups per half
    (16, 512, 128, 3, True),   # a few rows, one group per half, a bias
])
def test_kernel_matches_dequantized_weight(out_features, in_features, group, rows, bias):
    torch.manual_seed(out_features)
    linear = nn.Linear(in_features, out_features, bias=bias)
    layer = ti.Int4TritonLinear.from_linear(linear, group)
    x = torch.randn(rows, 1, in_features)
    expected = nn.functional.linear(x, layer.dequantize(torch.float32), linear.bias)
    torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-4)
    # The kernel is not a no-op around the fallback: it differs from a wrong scale's result.
    assert (layer(x) - nn.functional.linear(x, 1.01 * layer.dequantize(torch.float32), linear.bias)).abs().max() > 1e-3


@interpreted
def test_long_inputs_take_the_dequantized_matmul():
    linear = nn.Linear(128, 24, bias=False)
    layer = ti.Int4TritonLinear.from_linear(linear, 32)
    x = torch.randn(2, ti.MAX_ROWS, 128)  # 16 rows: prefill's path
    torch.testing.assert_close(layer(x), nn.functional.linear(x, layer.dequantize(torch.float32)), rtol=1e-5, atol=1e-5)


@interpreted
def test_int4_triton_decoder_matches_its_dequantized_reference():
    from kiln.llm.config import config_from_dict
    from kiln.llm.quant import dequantized_reference
    from kiln.llm.weights import random_decoder

    from .test_llm_quant import QUANT_CONFIG

    model = random_decoder(config_from_dict(QUANT_CONFIG), device="cpu", dtype=torch.float32, seed=0)
    spec = QuantSpec(kind="int4", group_size=64, backend="triton")
    quantized = quantize_decoder(model, spec)
    assert isinstance(quantized.layers[0].attn.wqkv, ti.Int4TritonLinear)
    assert isinstance(quantized.lm_head, ti.Int4TritonLinear)
    reference = dequantized_reference(model, quantized, spec)
    tokens = torch.randint(0, 256, (1, 1), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():  # one token: every projection runs the kernel
        torch.testing.assert_close(quantized(tokens), reference(tokens), rtol=1e-4, atol=1e-4)


def test_int4_triton_is_checked():
    from kiln.llm.config import config_from_dict

    from .test_llm_quant import QUANT_CONFIG

    config = config_from_dict(QUANT_CONFIG)
    with pytest.raises(ConfigError, match=r"--quant: int4@triton runs kiln's Triton kernel: CUDA"):
        check_quant(QuantSpec(kind="int4", backend="triton"), config, "cpu", torch.float32)
    with pytest.raises(ConfigError, match=r"--group-size: the triton int4 layout packs the two halves"):
        check_quant(QuantSpec(kind="int4", backend="triton", group_size=128), config, "cuda", torch.bfloat16)
    spec = check_quant(QuantSpec(kind="int8", backend="triton"), config, "cpu", torch.float32)
    assert spec.backend == "torch"  # int8 on kiln's own layouts is the torch layer
