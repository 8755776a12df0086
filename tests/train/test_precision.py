from __future__ import annotations

import pytest
import torch

from kiln.config import load_config
from kiln.errors import ConfigError
from kiln.precision import apply_precision, autocast, make_grad_scaler, resolve_precision, tf32_enabled
from kiln.train.trainer import train

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("name", "autocast_dtype", "param_dtype", "scaler"),
    [
        ("fp32", None, torch.float32, False),
        ("bf16-mixed", torch.bfloat16, torch.float32, False),
        ("fp16-mixed", torch.float16, torch.float32, True),
        ("bf16-true", None, torch.bfloat16, False),
    ],
)
def test_policy_shapes(name, autocast_dtype, param_dtype, scaler):
    policy = resolve_precision(name, CPU)
    assert policy.autocast_dtype == autocast_dtype
    assert policy.param_dtype == param_dtype
    assert (make_grad_scaler(policy, CPU) is not None) == scaler
    model = apply_precision(torch.nn.Linear(4, 4), policy)
    assert model.weight.dtype == param_dtype
    with autocast(policy, CPU):
        out = model(torch.randn(2, 4, dtype=param_dtype))
    assert out.dtype == (autocast_dtype or param_dtype)


def test_unknown_policy_is_config_error():
    with pytest.raises(ConfigError, match="precision.policy"):
        resolve_precision("fp8", CPU)


def test_tf32_context_restores():
    before = torch.get_float32_matmul_precision()
    with tf32_enabled(True):
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == before
    with tf32_enabled(False):
        assert torch.get_float32_matmul_precision() == "highest"
    assert torch.get_float32_matmul_precision() == before


@pytest.mark.parametrize("policy", ["fp32", "bf16-mixed", "fp16-mixed", "bf16-true"])
def test_each_policy_trains(tmp_path, tiny_overrides, policy):
    cfg = load_config(None, [*tiny_overrides, f"precision.policy={policy}", "optim.lr=3e-3"])
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "completed"
    assert summary["precision"] == policy
    assert summary["final_loss"] < summary["first_loss"]
