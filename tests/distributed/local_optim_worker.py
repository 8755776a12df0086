"""The rank side of test_local_optim: FSDP2 models on gloo stepped by kiln's ShardLocal optimizers
and by torch's own on the DTensor path, from the same start; the largest parameter difference per
case and the path each step took, reported as JSON by rank 0."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from gloo_ranks import finish


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # 33 and 7 output rows: uneven shards on two ranks (17/16, 4/3).
        self.a, self.b, self.late = torch.nn.Linear(24, 33), torch.nn.Linear(33, 7), torch.nn.Linear(24, 7)

    def forward(self, x, use_late: bool):
        out = self.b(torch.nn.functional.gelu(self.a(x)))
        return out + self.late(x) if use_late else out


def build(rank: int, late: bool):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Net()
    for layer in (model.a, model.b, model.late):
        fully_shard(layer)
    fully_shard(model)
    return model


def loss_of(model, step: int, rank: int, late: bool):
    torch.manual_seed(100 * step + rank)
    # `late`: a parameter whose first gradient comes at step 2
    return model(torch.randn(5, 24), late and step >= 2).square().mean()


def make_opt(cls, model, kind: str):
    groups = [{"params": [p for p in model.parameters() if p.ndim >= 2], "weight_decay": 0.1},
              {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}]
    if kind == "adamw-fused":
        return cls(groups, lr=1e-2, fused=True)
    if kind == "adamw-foreach":
        return cls(groups, lr=1e-2, foreach=True)
    return cls(groups, lr=1e-2, momentum=0.9, foreach=True)


def run(kind: str, local: bool, rank: int, steps: int, *, late: bool = True, found_inf_at: int = -1,
        reload_at: int = -1):
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from kiln.distributed.local_optim import ShardLocalAdamW, ShardLocalSGD

    cls = {True: ShardLocalSGD if kind == "sgd" else ShardLocalAdamW,
           False: torch.optim.SGD if kind == "sgd" else torch.optim.AdamW}[local]
    model = build(rank, late)
    opt = make_opt(cls, model, kind)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    paths = []
    for step in range(steps):
        if step == reload_at:  # a resume: a fresh model and optimizer loaded from the state dicts
            msd, osd = get_state_dict(model, opt)
            msd = {k: v.detach().clone() for k, v in msd.items()}
            model = build(rank, late)
            opt = make_opt(cls, model, kind)
            set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s), last_epoch=step - 1)
        loss_of(model, step, rank, late).backward()
        before = (getattr(opt, "local_steps", 0), getattr(opt, "dtensor_steps", 0))
        if step == found_inf_at:  # what GradScaler / the skip guard hand a fused kernel
            opt.found_inf, opt.grad_scale = torch.ones(()), None
        opt.step()
        if step == found_inf_at:
            del opt.found_inf, opt.grad_scale
        if local:
            paths.append("local" if opt.local_steps > before[0] else "dtensor")
        opt.zero_grad(set_to_none=True)
        sched.step()
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v
             for k, v in get_state_dict(model, opt)[1]["state"].items() for k, v in
             ((f"{k}.{s}", t) for s, t in v.items())}
    return full, state, paths, model


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report = {}
    cases = {"adamw-fused": {}, "adamw-foreach": {}, "sgd": {}, "found-inf": {"found_inf_at": 3},
             "resume": {"reload_at": 3}}
    for name, extra in cases.items():
        kind = "adamw-fused" if name in ("found-inf", "resume") else name
        ref, ref_state, _, _ = run(kind, False, rank, 6, **extra)
        mine, mine_state, paths, model = run(kind, True, rank, 6, **extra)
        report[name] = {
            "param_diff": max(float((ref[k] - mine[k]).abs().max()) for k in ref),
            "state_diff": max(float((ref_state[k].float() - mine_state[k].float()).abs().max()) for k in ref_state),
            "state_keys_equal": sorted(ref_state) == sorted(mine_state),
            "paths": paths,
            "moved": float((mine["a.weight"] - build(rank, True).a.weight.full_tensor()).abs().max()),
        }
    finish(report, out)


if __name__ == "__main__":
    main(sys.argv[1])
