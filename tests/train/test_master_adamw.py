"""precision.policy=bf16-master: AdamW over fp32 masters of bf16 parameters (kiln.train.master_adamw)
and its Triton update (kiln.kernels.master_kernel): torch's AdamW arithmetic, clipping folded into
the update, masters kept in fp32 across state_dict round trips, bad combinations refused."""

from __future__ import annotations

import pytest
import torch

from kiln.cli.main import main
from kiln.config import load_config
from kiln.errors import ConfigError
from kiln.precision import apply_precision, resolve_precision
from kiln.train.master_adamw import MasterAdamW, reference_update_
from kiln.train.optim import build_optimizer
from kiln.train.step import TrainStep

from ..kernels.triton_interpreter import interpreted, not_in_subprocess, rerun_interpreted

HYPER = {"lr": 3e-2, "betas": (0.9, 0.95), "eps": 1e-8}


def _bf16_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    return model.to(torch.bfloat16)


def _groups(params, weight_decay=0.1):
    params = list(params)
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def _random_grads(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=gen).to(p.dtype) for p in params]


@pytest.mark.parametrize("coef", [None, 0.25])
def test_reference_path_is_torch_adamw_on_the_fp32_masters(coef):
    model = _bf16_model()
    params = list(model.parameters())
    masters = [p.detach().float().clone().requires_grad_(True) for p in params]
    ours = MasterAdamW(_groups(params), use_kernel=False, **HYPER)
    theirs = torch.optim.AdamW(_groups(masters), foreach=False, **HYPER)
    for step in range(5):
        grads = _random_grads(params, step)
        for p, m, g in zip(params, masters, grads):
            p.grad = g
            m.grad = g.float() * coef if coef is not None else g.float()
        ours.clip_coef = torch.tensor(coef) if coef is not None else None
        ours.step()
        theirs.step()
        assert ours.clip_coef is None  # consumed by the step
        for p, m in zip(params, masters):
            state = ours.state[p]
            assert state["master"].dtype == torch.float32 and state["master"].equal(m.detach())
            assert p.dtype == torch.bfloat16 and p.equal(m.detach().to(torch.bfloat16))
            assert state["exp_avg"].equal(theirs.state[m]["exp_avg"])
            assert state["exp_avg_sq"].equal(theirs.state[m]["exp_avg_sq"])
    # the masters hold what bf16 cannot: the update is not rounded away between steps
    assert any(not ours.state[p]["master"].equal(p.float()) for p in params)


@not_in_subprocess
def test_under_interpreter():
    rerun_interpreted(__file__)


@interpreted
@pytest.mark.parametrize("coef", [None, 0.5])
def test_triton_update_matches_the_reference(coef):
    torch.manual_seed(1)
    n = 5000  # more than two of the kernel's blocks, the last one partial
    base = {"param": torch.randn(n).to(torch.bfloat16), "grad": torch.randn(n).to(torch.bfloat16)}
    moments = {"master": base["param"].float(), "exp_avg": torch.randn(n) * 0.1, "exp_avg_sq": torch.rand(n) * 0.01}
    ref = {k: v.clone() for k, v in {**base, **moments}.items()}
    got = {k: v.clone() for k, v in {**base, **moments}.items()}
    c = torch.tensor(coef) if coef is not None else None
    lr, wd, b1, b2, eps, step = 1e-2, 0.1, 0.9, 0.95, 1e-8, 3
    reference_update_(ref["param"], ref["grad"], ref["master"], ref["exp_avg"], ref["exp_avg_sq"], c, lr=lr,
                      weight_decay=wd, beta1=b1, beta2=b2, eps=eps, step=step)
    from kiln.kernels.master_kernel import master_adamw_

    master_adamw_(got["param"], got["grad"], got["master"], got["exp_avg"], got["exp_avg_sq"], c, decay=1 - lr * wd,
                  beta1=b1, beta2=b2, step_size=lr / (1 - b1**step), bc2_sqrt=(1 - b2**step) ** 0.5, eps=eps)
    for key in ("master", "exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(got[key], ref[key], rtol=1e-6, atol=1e-7)
    assert got["grad"].equal(base["grad"])  # the gradient is read, never scaled in place
    assert (got["param"].float() - ref["param"].float()).abs().max() <= ref["param"].float().abs().max() * 2**-7
    assert not got["master"].equal(moments["master"])


def test_train_step_folds_clipping_into_the_update():
    model = _bf16_model()
    params = list(model.parameters())
    masters = [p.detach().float().clone().requires_grad_(True) for p in params]
    opt = MasterAdamW(_groups(params), use_kernel=False, **HYPER)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    x, y = torch.randn(4, 8).to(torch.bfloat16), torch.randint(0, 3, (4,))
    loss_fn = lambda a, b: torch.nn.functional.cross_entropy(model(a).float(), b)  # noqa: E731
    step = TrainStep(model, loss_fn, opt, sched, grad_clip=0.01)
    loss_fn(x, y).backward()  # the gradients the step will see, before anything updates
    grads = [p.grad.clone() for p in params]
    opt.zero_grad(set_to_none=True)
    _, norm, _ = step([(x, y)])
    expected_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    torch.testing.assert_close(norm, expected_norm)
    coef = (0.01 / (expected_norm + 1e-6)).clamp(max=1.0)
    assert coef < 1  # clipping is active
    theirs = torch.optim.AdamW(_groups(masters), foreach=False, **HYPER)
    for m, g in zip(masters, grads):
        m.grad = g.float() * coef
    theirs.step()
    for p, m in zip(params, masters):
        torch.testing.assert_close(opt.state[p]["master"], m.detach(), rtol=1e-6, atol=1e-8)
    assert opt.clip_coef is None and all(p.grad is None for p in params)


def test_a_skipped_update_leaves_no_clip_coefficient_behind():
    from kiln.checkpoint.nonfinite import NonFiniteGuard

    model = _bf16_model()
    params = list(model.parameters())
    opt = MasterAdamW(_groups(params), use_kernel=False, **HYPER)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    x, y = torch.randn(4, 8).to(torch.bfloat16), torch.randint(0, 3, (4,))
    nan_loss = lambda a, b: torch.nn.functional.cross_entropy(model(a).float(), b) * float("nan")  # noqa: E731
    step = TrainStep(model, nan_loss, opt, sched, grad_clip=0.01, guard=NonFiniteGuard("skip", 10))
    before = [p.detach().clone() for p in params]
    step([(x, y)])
    assert opt.clip_coef is None and not opt.state  # the update was dropped, its coefficient with it
    assert all(p.equal(b) for p, b in zip(params, before))


def test_state_dict_round_trip_keeps_fp32_masters():
    model = _bf16_model()
    params = list(model.parameters())
    opt = MasterAdamW(_groups(params), use_kernel=False, **HYPER)
    for step in range(3):
        for p, g in zip(params, _random_grads(params, step)):
            p.grad = g
        opt.step()
    saved = opt.state_dict()
    fresh_model = _bf16_model(seed=1)
    fresh_model.load_state_dict(model.state_dict())
    fresh = MasterAdamW(_groups(fresh_model.parameters()), use_kernel=False, **HYPER)
    fresh.load_state_dict(saved)
    for p, q in zip(params, fresh_model.parameters()):
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert fresh.state[q][key].dtype == torch.float32 and fresh.state[q][key].equal(opt.state[p][key]), key
        assert int(fresh.state[q]["step"]) == 3
    # torch's own load would round the masters to the parameters' bf16
    rounded = torch.optim.Optimizer.load_state_dict
    plain = MasterAdamW(_groups(_bf16_model().parameters()), use_kernel=False, **HYPER)
    rounded(plain, saved)
    assert all(s["master"].dtype == torch.bfloat16 for s in plain.state.values())


def test_policy_builds_bf16_model_and_master_optimizer():
    cfg = load_config(None, ["precision.policy=bf16-master", "training.device=cpu"])
    policy = resolve_precision("bf16-master", torch.device("cpu"))
    assert policy.master_weights and policy.param_dtype == torch.bfloat16 and policy.autocast_dtype is None
    model = apply_precision(torch.nn.Linear(4, 4), policy)
    assert model.weight.dtype == torch.bfloat16
    opt = build_optimizer(model, cfg.optim, torch.device("cpu"), master_weights=True)
    assert isinstance(opt, MasterAdamW)
    assert [g["weight_decay"] for g in opt.param_groups] == [cfg.optim.weight_decay, 0.0]


@pytest.mark.parametrize(("extra", "needle"), [
    (["optim.name=sgd"], "optim.name"),
    (["compile.enabled=true", "compile.cudagraphs=true"], "compile.cudagraphs"),
    (["compile.enabled=true", "compile.scope=step"], "compile.scope"),
])
def test_combinations_it_cannot_run_exit_2_before_any_work(tmp_path, capsys, extra, needle):
    with pytest.raises(ConfigError, match="precision.policy"):
        load_config(None, ["precision.policy=bf16-master", *extra])
    run_dir = tmp_path / "run"
    code = main(["train", "--run-dir", str(run_dir), "precision.policy=bf16-master", "training.device=cpu",
                 "metrics.console=false", *extra])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kiln: error:")]
    assert code == 2 and len(errors) == 1 and "precision.policy" in errors[0] and needle in errors[0], errors
    assert not run_dir.exists()
