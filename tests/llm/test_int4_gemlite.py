"""int4@gemlite's layer over kiln's int4 layout (kiln.llm.int4_gemlite): what it hands gemlite's op,
and its CPU path. gemlite itself needs a CUDA device to import; its kernels are checked on a GPU
(benchmarks/int4_gemm_bench.py's rel_err and packing check)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")  # kiln's int4 layout module registers Triton kernels

from kiln.llm.int4_gemlite import (  # noqa: E402
    GEMLITE_KERNELS,
    Int4GemliteLinear,
    gemlite_missing,
    kernel_index,
    meta_args,
)
from kiln.llm.int4_layout import Int4TritonLinear  # noqa: E402


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
