"""kiln.distributed.local_optim: the optimizer update of FSDP2-sharded parameters run on local
shards equals torch's DTensor path bit for bit (two gloo ranks, uneven shards, AdamW fused and
foreach, SGD with momentum, a parameter whose first gradient comes late, a skipped step, a resume
through DCP state dicts); plain parameters take torch's path unchanged."""

from __future__ import annotations

import pytest
import torch

from kiln.config import load_config
from kiln.distributed.local_optim import ShardLocalAdamW, ShardLocalSGD
from kiln.train.optim import build_optimizer


@pytest.fixture(scope="module")
def report(run_ranks, tmp_path_factory):
    return run_ranks("local_optim_worker.py", tmp_path_factory.mktemp("local_optim") / "report.json")


@pytest.mark.parametrize("case", ["adamw-fused", "adamw-foreach", "sgd", "found-inf", "resume"])
def test_local_update_equals_the_dtensor_path(report, case):
    r = report[case]
    assert r["moved"] > 1e-4  # the parameters did train
    assert r["param_diff"] == 0.0 and r["state_diff"] == 0.0
    assert r["state_keys_equal"]
    # Step 0 creates the state on the DTensor path; so does step 2, where `late` gets its first
    # gradient; every other step runs on the local shards (after the resume too).
    assert r["paths"] == ["dtensor", "local", "dtensor", "local", "local", "local"]


@pytest.mark.parametrize("cls,base,kwargs", [(ShardLocalAdamW, torch.optim.AdamW, {"foreach": True}),
                                             (ShardLocalSGD, torch.optim.SGD, {"momentum": 0.9})])
def test_plain_parameters_take_torchs_path(cls, base, kwargs):
    def trained(opt_cls):
        torch.manual_seed(0)
        layer = torch.nn.Linear(6, 3)
        opt = opt_cls(layer.parameters(), lr=0.05, **kwargs)
        for step in range(4):
            torch.manual_seed(step)
            layer(torch.randn(4, 6)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        return layer, opt

    mine, opt = trained(cls)
    ref, _ = trained(base)
    assert opt.local_steps == 0 and opt.dtensor_steps == 4
    for a, b in zip(mine.parameters(), ref.parameters()):
        assert torch.equal(a, b)


def test_build_optimizer_takes_the_local_update_for_eager_fsdp_only():
    cfg = load_config(None, ["training.device=cpu"]).optim
    model = torch.nn.Linear(4, 4)
    cpu = torch.device("cpu")
    assert type(build_optimizer(model, cfg, cpu, shard_local=True)) is ShardLocalAdamW
    assert type(build_optimizer(model, cfg, cpu)) is torch.optim.AdamW
    # A compiled update traces the optimizer's own step: it stays torch's class.
    assert type(build_optimizer(model, cfg, cpu, shard_local=True, purpose="compiled")) is torch.optim.AdamW
    sgd = load_config(None, ["training.device=cpu", "optim.name=sgd"]).optim
    assert type(build_optimizer(model, sgd, cpu, shard_local=True)) is ShardLocalSGD
