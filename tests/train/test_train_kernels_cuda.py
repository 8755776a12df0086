"""kiln's SwiGLU and cross-entropy kernels compiled for a CUDA GPU (run on the device machine;
skipped in CPU CI, where tests/train/test_swiglu.py and test_triton_ce.py run the same kernels under
Triton's interpreter): results against eager PyTorch at real shapes, and a compiled tiny Llama that
trains the same with them as without."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln.kernels.triton_ce import triton_cross_entropy
from kiln.train.swiglu import apply_swiglu_kernel, swiglu

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the compiled kernels)")


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.view(torch.int16).int() - b.view(torch.int16).int()).abs().max())


def test_swiglu_matches_eager_pytorch():
    torch.manual_seed(0)
    gu = torch.randn(4, 300, 2 * 1000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ref_in = gu.detach().clone().requires_grad_(True)
    gate, up = ref_in.chunk(2, dim=-1)
    ref = F.silu(gate) * up
    got = swiglu(gu)
    dh = torch.randn_like(ref)
    ref.backward(dh)
    got.backward(dh)
    # one ulp at most (sigmoid's last fp32 bit may differ), and almost everywhere exact
    assert _ulps(got, ref) <= 1 and (got == ref).float().mean() > 0.99
    assert _ulps(gu.grad, ref_in.grad) <= 1 and (gu.grad == ref_in.grad).float().mean() > 0.99


def test_cross_entropy_matches_pytorch():
    torch.manual_seed(0)
    x = (torch.randn(300, 50_000, device="cuda") * 3).to(torch.bfloat16).requires_grad_(True)
    t = torch.randint(0, 50_000, (300,), device="cuda")
    t[::7] = -100
    ref_in = x.detach().clone().requires_grad_(True)
    ref = F.cross_entropy(ref_in.float(), t)
    got = triton_cross_entropy(x, t)
    ref.backward()
    got.backward()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert _ulps(x.grad, ref_in.grad.to(torch.bfloat16)) <= 1


def test_compiled_llama_trains_the_same_with_kiln_kernels():
    from kiln.llm import random_decoder
    from kiln.llm.config import config_from_dict, preset_config

    tokens = torch.randint(0, 100, (2, 33), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    grads = {}
    for kernels in ("plain", "kiln"):
        torch._dynamo.reset()
        model = random_decoder(config_from_dict(preset_config("llama-tiny")), device="cuda", dtype=torch.float32)
        model.requires_grad_(True)
        apply_swiglu_kernel(model, "fused" if kernels == "kiln" else "plain")
        ce = triton_cross_entropy if kernels == "kiln" else F.cross_entropy
        # called at once, in this iteration: the late binding B023 warns about cannot bite here
        loss = torch.compile(lambda: ce(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()))()  # noqa: B023
        loss.backward()
        grads[kernels] = (loss.detach(), [p.grad for p in model.parameters()])
    torch.testing.assert_close(grads["kiln"][0], grads["plain"][0], rtol=1e-5, atol=1e-5)
    for a, b in zip(grads["kiln"][1], grads["plain"][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_kiln_train_runs_the_fused_swiglu_under_float8_and_selective_checkpointing(tmp_path):
    """`training.swiglu_kernel=auto` is `fused` on CUDA for every llama: run: here with torchao's
    float8 linears, selective activation checkpointing and regional compile around it, through
    `kiln train` itself, training as the plain SwiGLU does."""
    import json

    from kiln.cli.main import main

    pytest.importorskip("torchao.float8")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 training needs compute capability 8.9 or newer")
    final = {}
    for kernel in ("plain", "auto"):
        run = tmp_path / kernel
        code = main(["train", "--run-dir", str(run), "model.name=llama:llama-tiny", "data.seq_len=64",
                     "data.batch_size=8", "training.steps=8", "precision.policy=bf16-mixed",
                     "precision.float8=tensorwise", "training.activation_checkpointing=selective",
                     "compile.enabled=true", "compile.regional=true", f"training.swiglu_kernel={kernel}",
                     "metrics.console=false", "metrics.tensorboard=false"])
        assert code == 0
        summary = json.loads((run / "summary.json").read_text())
        assert summary["features"]["swiglu_kernel"] == ("plain" if kernel == "plain" else "fused")
        final[kernel] = summary["final_loss"]
    assert final["auto"] == pytest.approx(final["plain"], rel=1e-2)
