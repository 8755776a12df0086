"""training.swiglu_kernel (kiln.train.swiglu): the fused SwiGLU equals eager PyTorch's
`F.silu(gate) * up` forward and backward, swaps in and out of kiln's decoder without touching its
parameters, and is refused where it cannot apply; its Triton kernels (kiln.kernels.swiglu_kernel)
match the reference under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln.cli.main import main
from kiln.config.schema import ModelConfig
from kiln.errors import ConfigError
from kiln.llm.model import FeedForward
from kiln.models import build_model
from kiln.train.losses import build_forward_loss
from kiln.train.swiglu import FusedSwiGLUFeedForward, apply_swiglu_kernel, resolve_swiglu_kernel, swiglu

from ..kernels.triton_interpreter import interpreted, not_in_subprocess, rerun_interpreted


def _eager(gu: torch.Tensor) -> torch.Tensor:
    gate, up = gu.chunk(2, dim=-1)
    return F.silu(gate) * up


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.view(torch.int16).int() - b.view(torch.int16).int()).abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_equals_eager_pytorch_forward_and_backward(dtype):
    torch.manual_seed(0)
    gu = (torch.randn(3, 5, 2 * 24) * 3).to(dtype).requires_grad_(True)
    ref_in = gu.detach().clone().requires_grad_(True)
    got, ref = swiglu(gu), _eager(ref_in)
    dh = torch.randn_like(ref)
    got.backward(dh)
    ref.backward(dh)
    assert got.dtype == dtype and got.shape == (3, 5, 24)
    assert got.equal(ref) and gu.grad.equal(ref_in.grad)


def test_swaps_in_and_back_without_touching_the_parameters():
    torch.manual_seed(0)
    built = build_model(ModelConfig(name="llama:llama-tiny"))
    model = built.module
    keys = {k: v.clone() for k, v in model.state_dict().items()}
    n_ffn = sum(isinstance(m, FeedForward) for m in model.modules())
    g = torch.Generator().manual_seed(1)
    window = torch.randint(512, (2, 17), generator=g)
    loss_fn = build_forward_loss(model, "causal_lm")

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        loss = loss_fn(window[:, :-1], window[:, 1:])
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    ref_loss, ref_grads = loss_and_grads()
    assert apply_swiglu_kernel(model, "fused") == n_ffn > 0
    assert all(type(m) is FusedSwiGLUFeedForward for m in model.modules() if isinstance(m, FeedForward))
    assert apply_swiglu_kernel(model, "fused") == 0  # already applied
    loss, grads = loss_and_grads()
    assert loss.equal(ref_loss) and all(a.equal(b) for a, b in zip(grads, ref_grads, strict=True))
    assert set(model.state_dict()) == set(keys)
    assert all(v.equal(keys[k]) for k, v in model.state_dict().items())
    assert apply_swiglu_kernel(model, "plain") == n_ffn
    assert not any(type(m) is FusedSwiGLUFeedForward for m in model.modules())


def test_compiled_graph_calls_the_ops_forward_and_backward():
    """Under torch.compile the activation stays kiln's two ops (nothing for inductor to split)."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    torch._dynamo.reset()
    graphs = {"fw": [], "bw": []}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
            return gm.forward
        return compiler

    backend = aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"),
                           partition_fn=min_cut_rematerialization_partition)
    gu = torch.randn(4, 16, requires_grad=True)
    torch.compile(swiglu, backend=backend)(gu).sum().backward()
    assert "kiln.swiglu.default" in graphs["fw"][0]
    assert "kiln.swiglu_backward.default" in graphs["bw"][0]
    assert "aten.silu.default" not in graphs["fw"][0] | graphs["bw"][0]


def test_resolve():
    model = build_model(ModelConfig(name="llama:llama-tiny")).module
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_swiglu_kernel("auto", model, cpu) == "plain"
    assert resolve_swiglu_kernel("auto", model, cuda) == "fused"
    assert resolve_swiglu_kernel("fused", model, cpu) == "fused"  # the ops' PyTorch path
    other = torch.nn.Sequential(torch.nn.Linear(4, 4))
    assert resolve_swiglu_kernel("auto", other, cuda) == "plain"
    with pytest.raises(ConfigError, match="training.swiglu_kernel.*llama:"):
        resolve_swiglu_kernel("fused", other, cpu)
    with pytest.raises(ConfigError, match="training.swiglu_kernel"):
        resolve_swiglu_kernel("triton", model, cpu)


def test_bad_value_exits_2_before_any_work(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", "--run-dir", str(run_dir), "training.swiglu_kernel=fast", "training.device=cpu",
                 "metrics.console=false"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kiln: error:")]
    assert code == 2 and len(errors) == 1 and "training.swiglu_kernel" in errors[0] and "fused" in errors[0], errors
    assert not run_dir.exists()


@not_in_subprocess
def test_under_interpreter():
    rerun_interpreted(__file__)


@interpreted
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_kernels_match_the_reference(dtype, monkeypatch):
    from kiln.kernels import swiglu_kernel
    from kiln.train.swiglu import _reference_backward, _reference_forward

    monkeypatch.setattr(swiglu_kernel, "BLOCK", 64)  # several blocks per row, the last one partial
    torch.manual_seed(0)
    gu = (torch.randn(3, 2 * 150) * 3).to(dtype)
    dh = torch.randn(3, 150).to(dtype)
    h, ref_h = swiglu_kernel.swiglu_forward(gu), _reference_forward(gu)
    d, ref_d = swiglu_kernel.swiglu_backward(gu, dh), _reference_backward(gu, dh)
    assert h.shape == ref_h.shape and d.shape == gu.shape
    if dtype == torch.float32:
        torch.testing.assert_close(h, ref_h, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(d, ref_d, rtol=1e-5, atol=1e-6)
    else:
        # the interpreter truncates to bf16 where a GPU rounds to nearest: a few ulps, never more
        assert _ulps(h, ref_h) <= 4 and _ulps(d, ref_d) <= 4


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_recomputes_the_fused_swiglu_exactly(mode):
    from kiln.train.activation_checkpoint import apply_activation_checkpointing

    window = torch.randint(512, (2, 17), generator=torch.Generator().manual_seed(1))
    results = []
    for ac in ("none", mode):
        torch.manual_seed(0)
        built = build_model(ModelConfig(name="llama:llama-tiny"))
        apply_swiglu_kernel(built.module, "fused")
        apply_activation_checkpointing(built.blocks, ac)
        loss = build_forward_loss(built.module, "causal_lm")(window[:, :-1], window[:, 1:])
        loss.backward()
        results.append((loss.detach(), [p.grad for p in built.module.parameters()]))
    assert results[1][0].equal(results[0][0])
    assert all(a.equal(b) for a, b in zip(results[1][1], results[0][1], strict=True))
