"""kiln's decode matrix-vector kernel (kiln.kernels.triton_matvec) and the fused decode step
(kiln.llm.decode_matvec) on CPU through Triton's interpreter: the kernel against the eager math
for each fused part (RMSNorm, SwiGLU, bias, residual), split inputs, several rows, partial blocks;
whole decode steps against the plain modules on llama (biases), qwen3 (q/k norms) and mistral
(windowed) checkpoints, and with int4@triton weights; a compiled step; the checks. Triton picks its
interpreter when first imported, so the kernel tests run in a subprocess (`test_under_interpreter`);
fp16 stands in for bf16 there (the interpreter truncates when it rounds to bf16)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kiln.errors import ConfigError
from kiln.kernels.triton_launch import device_name
from kiln.llm import decode_matvec as dm
from kiln.llm.config import resolve_model
from kiln.llm.kernels import use_decode_kernels
from kiln.llm.model import KVCache, RMSNorm
from kiln.llm.weights import build_decoder

from ..llm.conftest import assert_decode_matches_matmul
from .triton_interpreter import interpreted, not_in_subprocess, rerun_interpreted

tm = pytest.importorskip("kiln.kernels.triton_matvec", reason="Triton is not installed (pip install 'kiln[test]')")


@not_in_subprocess
def test_under_interpreter():
    rerun_interpreted(__file__)


def eager(x, layer, norm=None, silu_mul=False, residual=None):
    if norm is not None:
        x = norm(x)
    if silu_mul:
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    y = layer(x)
    return y if residual is None else residual + y


def case(dtype, rows, out_f, in_f, part, bias, seed):
    torch.manual_seed(seed)
    layer = nn.Linear(in_f, out_f, bias=bias).to(dtype)
    norm = RMSNorm(in_f, 1e-5).to(dtype) if part == "rmsnorm" else None
    if norm is not None:
        norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(rows, 1, 2 * in_f if part == "silu_mul" else in_f, dtype=dtype)
    residual = torch.randn(rows, 1, out_f, dtype=dtype) if part == "residual" else None
    return layer, x, norm, residual


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows,out_f,in_f,part,bias,setting", [
    (1, 24, 96, "none", False, [4, 32, 1]),
    (1, 24, 96, "rmsnorm", False, [8, 32, 2]),      # split in two: each split computes the whole row's rms
    (3, 17, 80, "silu_mul", True, [4, 32, 3]),     # 17 outputs (a partial block), 80 inputs in 3 uneven splits
    (2, 40, 64, "residual", True, [16, 16, 4]),
])
def test_kernel_matches_the_eager_math(dtype, rows, out_f, in_f, part, bias, setting):
    layer, x, norm, residual = case(dtype, rows, out_f, in_f, part, bias, seed=out_f + rows)
    y = dm.fused_linear(layer, x, norm=norm, silu_mul=part == "silu_mul", residual=residual)
    expected = eager(x, layer, norm, part == "silu_mul", residual)
    tol = 1e-5 if dtype == torch.float32 else 2e-3 * float(expected.detach().abs().max())
    torch.testing.assert_close(y, expected, rtol=tol, atol=tol)
    forced = torch.ops.kiln.matvec(x.reshape(rows, -1), layer.weight, layer.bias,
                                   None if norm is None else norm.weight, 1e-5, part == "silu_mul",
                                   None if residual is None else residual.reshape(rows, -1), setting)
    torch.testing.assert_close(forced.view_as(expected), expected, rtol=tol, atol=tol)
    # Every split arrived and the last one reset its counter: the next call starts from zero.
    from kiln.kernels import triton_launch  # the counters kiln's Triton kernels share

    assert all(int(c.abs().sum()) == 0 for c in triton_launch._ARRIVED.values())


@interpreted
def test_a_pinned_setting_skips_the_tuning(monkeypatch):
    """PINNED[(N, K, M, PROLOGUE, HAS_RES)] is what launches for that shape (without it, the
    interpreter's setting), and the product is the same."""
    inner, seen = tm._kernel(), []

    class Spy:  # records each launch's setting, then launches
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append((kw["BLOCK_N"], kw["BLOCK_K"], kw["SPLIT"]))
                return inner[grid](*args, **kw)
            return launch

    monkeypatch.setitem(tm._KERNELS, True, Spy())
    layer, x, _, _ = case(torch.float32, 1, 8, 128, "none", False, seed=4)
    plain = torch.ops.kiln.matvec(x.reshape(1, -1), layer.weight, None, None, 0.0, False, None)
    monkeypatch.setitem(tm.PINNED, (8, 128, 1, 0, False), (8, 32, 4))
    pinned = torch.ops.kiln.matvec(x.reshape(1, -1), layer.weight, None, None, 0.0, False, None)
    assert seen == [tm.INTERPRETED_SETTING, (8, 32, 4)]
    torch.testing.assert_close(pinned, plain, rtol=1e-5, atol=1e-5)


def test_measured_settings_are_candidates_the_tuner_keeps_and_apply_on_their_gpu(monkeypatch):
    """Each GPU's measured setting is one the autotuner could pick (a candidate its pruning keeps for
    that K); on that GPU it is what launches, elsewhere the tuner decides, and PINNED overrides both."""
    for table in tm.MEASURED.values():
        for (_n, k, m, prologue, _res), setting in table.items():
            assert setting in tm.DENSE_SETTINGS and k >= setting[2] * setting[1] and m == 1 and prologue in (0, 1, 2)
    key = next(iter(tm.MEASURED["NVIDIA H200"]))
    monkeypatch.setattr(tm, "_LAUNCHED", {})
    names = {0: "NVIDIA H200", 1: "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: names[index])
    device_name.cache_clear()
    try:
        assert tm.measured_setting(torch.device("cuda", 0), key) == tm.MEASURED["NVIDIA H200"][key]
        assert tm.measured_setting(torch.device("cuda", 1), key) is None
        assert tm.measured_setting(torch.device("cpu"), key) is None
        monkeypatch.setitem(tm.PINNED, key, (8, 256, 1))
        assert tm.measured_setting(torch.device("cuda", 0), key) == (8, 256, 1)
    finally:
        device_name.cache_clear()


def test_tuned_settings_read_the_autotuners_choices(monkeypatch):
    from types import SimpleNamespace

    import triton

    assert isinstance(tm.tuned_settings(), dict)
    monkeypatch.setattr(tm, "_LAUNCHED", {})
    chosen = {(5120, 3072, 1, 1, False, "torch.bfloat16"): triton.Config({"BLOCK_N": 8, "BLOCK_K": 512, "SPLIT": 2}),
              (3072, 3072, 1, 0, True, "torch.bfloat16"): triton.Config({"BLOCK_N": 4, "BLOCK_K": 256, "SPLIT": 1})}
    monkeypatch.setitem(tm._KERNELS, False, SimpleNamespace(cache=chosen))
    assert tm.tuned_settings() == {"3072,3072,1,0,True": [4, 256, 1], "5120,3072,1,1,False": [8, 512, 2]}
    monkeypatch.setitem(tm.PINNED, (3072, 8192, 1, 2, True), (16, 512, 2))  # launched fixed: listed beside them
    assert tm.measured_setting(torch.device("cpu"), (3072, 8192, 1, 2, True)) == (16, 512, 2)
    assert tm.tuned_settings()["3072,8192,1,2,True"] == [16, 512, 2] and len(tm.tuned_settings()) == 3


@interpreted
def test_split_partials_are_all_added():
    """With 4 splits the result is the whole product, not the last split's share."""
    layer, x, _, _ = case(torch.float32, 1, 8, 128, "none", False, seed=3)
    full = torch.ops.kiln.matvec(x.reshape(1, -1), layer.weight, None, None, 0.0, False, None, [8, 32, 1])
    split = torch.ops.kiln.matvec(x.reshape(1, -1), layer.weight, None, None, 0.0, False, None, [8, 32, 4])
    torch.testing.assert_close(split, full, rtol=1e-5, atol=1e-5)
    quarter = F.linear(x.reshape(1, -1)[:, 96:], layer.weight[:, 96:])
    assert (split - quarter).abs().max() > 1e-2


@interpreted
@pytest.mark.parametrize("family", ["llama-untied", "qwen3", "mistral"])  # biases; q/k norms; windows
def test_fused_decode_steps_match_the_plain_modules(checkpoints, family):
    model = build_decoder(resolve_model(str(checkpoints[family])), device="cpu", dtype=torch.float32)
    tokens = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(4))
    assert_decode_matches_matmul(model, "triton", tokens, torch.tensor([0, 3]), matvec="triton", tol=1e-4)


@interpreted
def test_fused_decode_with_int4_triton_weights():
    from kiln.llm.config import config_from_dict
    from kiln.llm.quant import QuantSpec, dequantized_reference, quantize_decoder
    from kiln.llm.weights import random_decoder

    from ..llm.test_llm_quant import QUANT_CONFIG

    small = {**QUANT_CONFIG, "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128}  # the interpreter is slow
    model = random_decoder(config_from_dict(small), device="cpu", dtype=torch.float32, seed=0)
    spec = QuantSpec(kind="int4", group_size=32, backend="triton")
    quantized = quantize_decoder(model, spec)
    tokens = torch.randint(0, 96, (1, 7), generator=torch.Generator().manual_seed(5))
    assert_decode_matches_matmul(quantized, "matmul", tokens, torch.tensor([0]), prompt=4, matvec="triton", tol=1e-4,
                                 reference=dequantized_reference(model, quantized, spec))


@interpreted
def test_fused_decode_step_compiles_as_one_graph(checkpoints):
    model = build_decoder(resolve_model(str(checkpoints["qwen2"])), device="cpu", dtype=torch.float32)
    use_decode_kernels(model, matvec="triton")
    tokens = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(6))
    cache = KVCache(model.config, 1, 12, dtype=torch.float32, device="cpu")

    def step(token, slot):
        return model(token, cache=cache, decode_slot=slot)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        model(tokens[:, :9], cache=cache)
        eager_logits = step(tokens[:, 9:], torch.tensor([9]))
        torch.testing.assert_close(compiled(tokens[:, 9:], torch.tensor([9])), eager_logits, rtol=1e-5, atol=1e-5)


def test_layouts_the_kernel_does_not_read_keep_their_own_matmul():
    """On CPU without the interpreter (and for layers it does not read) the fused call is the eager math."""
    layer, x, norm, residual = case(torch.float32, 1, 12, 32, "rmsnorm", True, seed=1)
    torch.testing.assert_close(dm.fused_linear(layer, x, norm=norm), eager(x, layer, norm))
    layer, x, _, residual = case(torch.float32, 1, 12, 32, "silu_mul", False, seed=2)
    residual = torch.randn(1, 1, 12)
    torch.testing.assert_close(dm.fused_linear(layer, x, silu_mul=True, residual=residual),
                               eager(x, layer, None, True, residual))


def test_decode_matvec_is_checked(checkpoints):
    from kiln.llm.engine import Engine

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert dm.check("inductor", cuda, torch.bfloat16) == "inductor"
    with pytest.raises(ConfigError, match=r"decode_matvec: triton needs fp16 or bf16 \(the model is float32\)"):
        dm.check("triton", cuda, torch.float32)
    with pytest.raises(ConfigError, match=r"decode_matvec: unknown decode matrix-vector kernel 'trition'"):
        dm.check("trition", cpu, torch.float32)
    model = build_decoder(resolve_model(str(checkpoints["llama3-tied"])), device="cpu", dtype=torch.float32)
    with pytest.raises(ConfigError, match="decode_matvec: triton needs a CUDA device"):
        Engine(model, decode_matvec="triton")
    assert Engine(model).decode_matvec == "inductor"  # `auto` where triton cannot run
    assert dm.check("auto", cpu, torch.bfloat16) == "inductor"
    assert dm.check("auto", cuda, torch.float32) == "inductor"
