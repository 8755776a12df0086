"""kiln's int4 layout (kiln.llm.int4_layout) and Triton kernel (kiln.kernels.triton_int4) on CPU through
Triton's interpreter: the packing, the kernel against the layer's own dequantized weight (rows, bias, partial blocks,
uneven splits, 1-3 groups in flight, bf16's exponent-add path), each fused part (RMSNorm, SwiGLU, the folded norm's
scalar, the SwiGLU epilogue, a residual), and `int4@triton` through quantize_decoder: norms folded,
gate/up interleaved, the same outputs as its dequantized reference, the original model untouched.
Triton picks its interpreter when first imported, so the kernel tests run in a subprocess
(`test_under_interpreter`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kiln.errors import ConfigError
from kiln.llm.quant import QuantSpec, check_quant, quantize_decoder

from .triton_interpreter import interpreted, not_in_subprocess, rerun_interpreted

pytest.importorskip("triton", reason="Triton is not installed (pip install 'kiln[test]')")
ti = pytest.importorskip("kiln.llm.int4_layout")


@not_in_subprocess
def test_under_interpreter():
    rerun_interpreted(__file__)


def test_packing_round_trips():
    q = torch.randint(0, 16, (6, 64), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    words = ti.pack_words(q)
    assert words.shape == (8, 6) and words.dtype == torch.int32
    assert torch.equal(ti.unpack_words(words), q)
    assert int(words[0, 0]) & 15 == int(q[0, 0]) and (int(words[0, 0]) >> 28) & 15 == int(q[0, 7])
    rows = torch.arange(8).view(8, 1).float()
    assert ti.interleave_halves(rows).flatten().tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert torch.equal(ti.split_halves(ti.interleave_halves(rows)), rows)


def test_layer_dequantizes_to_the_rounded_weight():
    linear = nn.Linear(64, 12)
    norm_weight = torch.rand(64) + 0.5
    layer = ti.Int4TritonLinear.from_linear(linear, 32, norm_weight=norm_weight, interleave=True)
    target = linear.weight.detach() * norm_weight
    err = (layer.dequantize(torch.float32) - target).abs()
    step = (target.view(12, 2, 32).amax(-1) - target.view(12, 2, 32).amin(-1)) / 15  # one step per group
    assert (err.view(12, 2, 32) <= step[..., None] / 2 + 1e-6).all()
    assert torch.equal(layer.dequantize(stored_order=True), ti.interleave_halves(layer.dequantize()))
    x = torch.randn(20, 64)  # more rows than the kernel takes: the dequantized matmul, original order
    torch.testing.assert_close(layer(x), F.linear(x, layer.dequantize(torch.float32), linear.bias))


def eager_reference(layer, x, prologue, swiglu, residual, norm_weight, eps=1e-5):
    """The kernel's result in plain fp32 ops, from the layer's dequantized weight (stored order)."""
    x = x.float()
    if prologue in ("rmsnorm", "rms"):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        x = x if prologue == "rms" else x * norm_weight
    if prologue == "silu_mul":
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    bias = None if layer.bias is None else layer.bias.float()
    y = F.linear(x, layer.dequantize(torch.float32, stored_order=True), bias)
    if swiglu:
        gate, up = y.view(y.shape[0], -1, 2).unbind(-1)
        return F.silu(gate) * up
    return y if residual is None else y + residual.float()


@interpreted
@pytest.mark.parametrize("out_f,in_f,group,rows,bias,prologue,swiglu,residual,setting", [
    (40, 256, 32, 1, False, "none", False, False, [32, 1, 3]),  # a partial block; 3 of 8 groups in flight
    (16, 512, 128, 3, True, "none", False, False, [16, 3]),     # 4 groups in 3 uneven splits, rows, a bias
    (24, 256, 64, 2, False, "rmsnorm", False, True, [8, 2, 1]),  # unfolded norm per x, a residual; depth 1
    (24, 128, 32, 2, True, "silu_mul", False, False, [16, 4]),  # SwiGLU of the input halves first
    (48, 256, 32, 1, False, "rms", True, False, [16, 2]),       # folded norm's scalar; SwiGLU epilogue
    (20, 256, 32, 2, False, "rms", True, False, [8, 8, 2, 8]),  # 10 SwiGLU outputs, 8 splits, 8 warps
])
def test_kernel_matches_the_dequantized_math(out_f, in_f, group, rows, bias, prologue, swiglu, residual, setting):
    check_int4_op(torch.ops.kiln.int4_matvec, out_f, in_f, group, rows, bias, prologue, swiglu, residual, setting,
                  seed=out_f + in_f)


def check_int4_op(op, out_f, in_f, group, rows, bias, prologue, swiglu, residual, setting, *, seed: int) -> None:
    """`op` (kiln::int4_matvec's arguments) on a random layer equals `eager_reference`, and a layer
    with 1 % larger scales does not: the comparison can fail."""
    torch.manual_seed(seed)
    layer = ti.Int4TritonLinear.from_linear(nn.Linear(in_f, out_f, bias=bias), group, interleave=swiglu)
    x = torch.randn(rows, 2 * in_f if prologue == "silu_mul" else in_f)
    norm_weight = torch.rand(in_f) + 0.5 if prologue == "rmsnorm" else None
    res = torch.randn(rows, out_f) if residual else None
    y = op(x, layer.weight, layer.scale, layer.offset, group, layer.bias, norm_weight, 1e-5, prologue, swiglu, res,
           setting)
    expected = eager_reference(layer, x, prologue, swiglu, res, norm_weight)
    assert y.shape == expected.shape
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)
    larger = ti.Int4TritonLinear(layer.weight, 1.01 * layer.scale, layer.offset, layer.bias, group_size=group,
                                 interleaved=swiglu)
    assert (y - eager_reference(larger, x, prologue, swiglu, res, norm_weight)).abs().max() > 1e-3


@interpreted
@pytest.mark.parametrize("prologue", ["none", "rms"])
def test_bf16_inputs_take_the_exponent_add_path(prologue):
    """bf16 x without a per-value prologue is scaled by an integer add on its bits (zeros included)."""
    torch.manual_seed(1)
    layer = ti.Int4TritonLinear.from_linear(nn.Linear(256, 32, bias=False), 64).to(torch.bfloat16)
    x = torch.randn(2, 256).to(torch.bfloat16)
    x[0, :40] = 0.0  # zeros: their products with any nibble must vanish
    x[1, 3] = -0.0
    y = torch.ops.kiln.int4_matvec(x, layer.weight, layer.scale, layer.offset, 64, None, None, 1e-5, prologue, False,
                                   None, [16, 2])
    expected = eager_reference(layer, x, prologue, False, None, None)
    torch.testing.assert_close(y.float(), expected, rtol=2e-2, atol=2e-2 * float(expected.abs().max()))


@interpreted
def test_int4_triton_decoder_matches_its_dequantized_reference():
    from kiln.llm.config import config_from_dict
    from kiln.llm.quant import dequantized_reference
    from kiln.llm.weights import random_decoder

    from ..llm.test_llm_quant import QUANT_CONFIG

    # The shapes of the other int4 decode tests (two groups per input row): the interpreter is slow.
    small = {**QUANT_CONFIG, "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128}
    model = random_decoder(config_from_dict(small), device="cpu", dtype=torch.float32, seed=0)
    for norm in (model.norm, model.layers[0].attn_norm, model.layers[1].ffn_norm):
        norm.weight.data.uniform_(0.5, 1.5)  # real norms are not all ones: folding must carry them
    before = {k: v.clone() for k, v in model.state_dict().items()}
    spec = QuantSpec(kind="int4", group_size=32, backend="triton")
    quantized = quantize_decoder(model, spec)
    block = quantized.layers[0]
    assert isinstance(block.attn.wqkv, ti.Int4TritonLinear) and isinstance(quantized.lm_head, ti.Int4TritonLinear)
    assert block.attn.wqkv.folded_norm and block.ffn.w_gate_up.interleaved and not block.attn.wo.folded_norm
    assert block.attn_norm.folded and quantized.norm.folded and torch.equal(quantized.norm.weight, torch.ones(64))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the original is untouched
    assert not model.norm.folded and not model.layers[0].attn_norm.folded
    reference = dequantized_reference(model, quantized, spec)
    # Three tokens: a multi-row prefill through the kernel (each row is one more set of programs
    # under the interpreter; the first three tokens are those six would start with).
    tokens = torch.randint(0, 96, (1, 3), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(quantized(tokens[:, :1]), reference(tokens[:, :1]), rtol=1e-4, atol=1e-4)
        prefill = quantized(tokens)  # prefill's path
        torch.testing.assert_close(prefill, reference(tokens), rtol=1e-4, atol=1e-4)
        # Folding is the same model: the unquantized weights times the norms give the original's logits.
        original = model(tokens)
        assert (prefill - original).abs().max() < 0.5 * float(original.abs().max())


def test_int4_triton_is_checked():
    from kiln.llm.config import config_from_dict

    from ..llm.test_llm_quant import QUANT_CONFIG

    config = config_from_dict(QUANT_CONFIG)
    with pytest.raises(ConfigError, match=r"--quant: int4@triton runs kiln's Triton kernel: CUDA"):
        check_quant(QuantSpec(kind="int4", backend="triton"), config, "cpu", torch.float32)
    with pytest.raises(ConfigError, match=r"--group-size: 256 does not divide the 128 input features"):
        check_quant(QuantSpec(kind="int4", backend="triton", group_size=256), config, "cuda", torch.bfloat16)
    assert check_quant(QuantSpec(kind="int4", backend="triton", group_size=128), config, "cuda",
                       torch.bfloat16).backend == "triton"  # K % group is all this layout needs
    spec = check_quant(QuantSpec(kind="int8", backend="triton"), config, "cpu", torch.float32)
    assert spec.backend == "torch"  # int8 on kiln's own layouts is the torch layer


def test_autotuner_keeps_settings_that_fill_the_gpu(monkeypatch):
    """`_prune` on the 3B shapes of a 132-SM GPU: splits for the narrow projections (three programs
    per SM), none for the lm_head, and a layer too small to fill the GPU keeps every valid setting."""
    from types import SimpleNamespace

    import triton

    from kiln.kernels import triton_int4 as tk

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(multi_processor_count=132))
    configs = [triton.Config({"BLOCK_N": bn, "SPLIT": s, "DEPTH": d}, num_warps=w) for bn, s, d, w in tk.SETTINGS]

    def kept(k, n, m=1):
        return {(c.kwargs["BLOCK_N"], c.kwargs["SPLIT"], c.kwargs["DEPTH"])
                for c in tk._prune(configs, {"K": k, "GROUP": 128, "N": n, "M": m})}

    assert kept(3072, 5120) == {(64, 8, 3), (128, 16, 2)}  # wqkv: 640 programs each
    assert kept(8192, 3072) == {(64, 16, 3)}  # w_down: 768 programs, 4 groups each
    assert kept(3072, 128256) == {(256, 1, 1), (256, 1, 2)}  # the lm_head: 501 blocks, no splits
    gate_up = kept(3072, 16384)
    assert (128, 4, 3) in gate_up and all(128 * 16384 // bn * s >= 3 * 132 * 128 for bn, s, _ in gate_up)
    assert (128, 2, 2) in kept(3072, 16384, m=4)  # rows are programs too
    small = kept(1024, 256)  # 8 groups, 256 outputs: nothing gives 264 programs
    assert small and all(s <= 8 and d <= -(-8 // s) for _, s, d in small)
    assert (128, 2, 3) in small and (64, 8, 3) not in small  # one group per split cannot keep 3 in flight


def test_measured_settings_are_candidates_the_tuner_keeps_and_apply_on_their_gpu(monkeypatch):
    """Each H200 setting of MEASURED is one the autotuner could pick on that GPU's 132 SMs (a candidate
    its pruning keeps for the key's shape); on an H200 it is what launches, on another GPU the tuner
    decides, and PINNED overrides both."""
    from types import SimpleNamespace

    import triton

    from kiln.kernels import triton_int4 as tk
    from kiln.kernels.triton_launch import device_name, fixed_setting

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(multi_processor_count=132))
    configs = [triton.Config({"BLOCK_N": bn, "SPLIT": s, "DEPTH": d}, num_warps=w) for bn, s, d, w in tk.SETTINGS]
    for (n, k, group, m, _prologue, _swiglu, _res), setting in tk.MEASURED["NVIDIA H200"].items():
        kept = {(c.kwargs["BLOCK_N"], c.kwargs["SPLIT"], c.kwargs["DEPTH"], c.num_warps)
                for c in tk._prune(configs, {"K": k, "GROUP": group, "N": n, "M": m})}
        assert setting in kept, (n, k, setting, kept)
    key = next(iter(tk.MEASURED["NVIDIA H200"]))
    names = {0: "NVIDIA H200", 1: "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: names[index])
    device_name.cache_clear()
    try:
        assert fixed_setting(tk.PINNED, tk.MEASURED, torch.device("cuda", 0), key) == tk.MEASURED["NVIDIA H200"][key]
        assert fixed_setting(tk.PINNED, tk.MEASURED, torch.device("cuda", 1), key) is None
        monkeypatch.setitem(tk.PINNED, key, (64, 8, 3, 4))
        assert fixed_setting(tk.PINNED, tk.MEASURED, torch.device("cuda", 1), key) == (64, 8, 3, 4)
    finally:
        device_name.cache_clear()


@interpreted
def test_a_pinned_setting_skips_the_tuning(monkeypatch):
    """PINNED[(N, K, GROUP, M, PROLOGUE, SWIGLU, HAS_RES)] is what launches for that shape (without it,
    the interpreter's setting), and the product is the same."""
    from kiln.kernels import triton_int4 as tk

    inner, seen = tk._kernel(), []

    class Spy:  # records each launch's setting, then launches
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append((kw["BLOCK_N"], kw["SPLIT"], kw["DEPTH"], kw["num_warps"]))
                return inner[grid](*args, **kw)
            return launch

    monkeypatch.setitem(tk._KERNELS, True, Spy())
    torch.manual_seed(2)
    layer = ti.Int4TritonLinear.from_linear(nn.Linear(256, 32, bias=False), 64)
    x = torch.randn(1, 256)
    call = lambda: torch.ops.kiln.int4_matvec(x, layer.weight, layer.scale, layer.offset, 64)  # noqa: E731
    plain = call()
    monkeypatch.setitem(tk.PINNED, (32, 256, 64, 1, 0, False, False), (16, 2, 1, 4))
    pinned = call()
    assert seen == [(*tk.INTERPRETED_SETTING, 4), (16, 2, 1, 4)]
    torch.testing.assert_close(pinned, plain, rtol=1e-5, atol=1e-5)


def test_tuned_settings_read_the_autotuners_choices(monkeypatch):
    """Its choices (kept on disk across processes) as 'N,K,GROUP,M,PROLOGUE,SWIGLU,HAS_RES' -> [BLOCK_N,
    SPLIT, DEPTH, warps], and the fixed settings launched; nothing before it ran."""
    import triton

    from kiln.kernels import triton_int4 as tk
    from kiln.kernels.triton_launch import fixed_setting

    monkeypatch.setitem(tk._KERNELS, False, None)
    assert tk.tuned_settings() == {}
    config = triton.Config({"BLOCK_N": 128, "SPLIT": 4, "DEPTH": 3}, num_warps=4)
    from types import SimpleNamespace

    monkeypatch.setitem(tk._KERNELS, False, SimpleNamespace(cache={(5120, 3072, 128, 1, 3, False, False, "x"): config}))
    assert tk.tuned_settings() == {"5120,3072,128,1,3,False,False": [128, 4, 3, 4]}
    # a pinned or measured setting that launched is listed beside them
    monkeypatch.setattr(tk, "_LAUNCHED", {})
    key = (3072, 8192, 128, 1, 0, False, True)
    monkeypatch.setitem(tk.PINNED, key, (64, 16, 3, 4))
    assert fixed_setting(tk.PINNED, tk.MEASURED, torch.device("cpu"), key, tk._LAUNCHED) == (64, 16, 3, 4)
    assert tk.tuned_settings() == {"5120,3072,128,1,3,False,False": [128, 4, 3, 4],
                                   "3072,8192,128,1,0,False,True": [64, 16, 3, 4]}


@pytest.mark.parametrize("projection,setting", [("wqkv", (128, 4, 3, 4)), ("w_gate_up", (256, 1, 2, 4)),
                                                ("w_down", (64, 8, 3, 4))])
def test_kernel_compiles_for_hopper(projection, setting):
    """The one-row kernel compiles for sm_90 on this CPU (benchmarks/kernel_resources.py) for the 3B's
    projections, its fused norm, SwiGLU epilogue and residual add: the interpreter the other tests use
    does not check what the GPU compiler refuses."""
    from tests.benchmark_scripts import load_script

    from kiln.kernels import triton_int4 as tk

    assert setting in tk.SETTINGS
    resources = load_script("kernel_resources")
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton has no NVIDIA backend here")
    n, k, prologue, swiglu, residual = resources.INT4_3B[projection]
    compiled = resources.int4_matvec(tk, n=n, k=k, group=128, prologue=prologue, swiglu=swiglu, residual=residual,
                                     setting=setting)
    used = resources.usage(compiled)
    assert 0 < used["registers"] <= 255 and used["stack_bytes"] == 0
