"""The rank side of test_fsdp_recipes' bf16-master test: an FSDP2-sharded bf16 model whose
MasterAdamW keeps fp32 masters of each rank's shard, trained by kiln's TrainStep (clip folded into
the update over the sharded norm); an async checkpoint at step 3 while steps 4-6 run, then a fresh
model loads it and runs steps 4-6 again. Reports what the test compares, as JSON."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from gloo_ranks import finish

LR, CLIP = 1e-2, 0.05


def build(seed: int):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from kiln.train.master_adamw import MasterAdamW
    from kiln.train.optim import param_groups
    from kiln.train.step import TrainStep

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.GELU(), torch.nn.Linear(33, 32),
                                torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)).to(torch.bfloat16)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for i in (0, 2, 4):
        fully_shard(model[i], mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    # KERNEL=1 (with TRITON_INTERPRET=1): the update runs kiln's Triton kernel on the local shards.
    kernel = os.environ.get("KERNEL") == "1"
    optimizer = MasterAdamW(param_groups(model, 0.1), lr=LR, betas=(0.9, 0.95), eps=1e-8, use_kernel=kernel)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + 0.1 * s))

    def forward_loss(inputs, targets):
        return torch.nn.functional.cross_entropy(model(inputs).float(), targets)

    return model, TrainStep(model, forward_loss, optimizer, scheduler, grad_clip=CLIP)


def batch(step: int):
    gen = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return torch.randn(4, 16, generator=gen).to(torch.bfloat16), torch.randint(0, 8, (4,), generator=gen)


def state_of(model, optimizer) -> dict[str, torch.Tensor]:
    """This rank's local shards of the parameters and of each fp32 state tensor."""
    out = {}
    for name, p in model.named_parameters():
        out[name] = p._local_tensor.detach().clone()
        for key, value in optimizer.state[p].items():
            out[f"{name}.{key}"] = (value._local_tensor if hasattr(value, "_local_tensor") else value).detach().clone()
    return out


def main(out: str) -> None:
    from kiln.checkpoint import AppState, Checkpointer
    from kiln.checkpoint.dcp_io import read_metadata
    from kiln.config.schema import CheckpointConfig

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    root = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(root)
    run_dir = Path(root[0])

    model, step = build(seed=0)
    app = AppState(model, step.optimizer, step.scheduler, rank=rank, world_size=world)
    ck = Checkpointer(run_dir, CheckpointConfig(async_save=True), rank=rank, world_size=world)
    norms = []
    for i in range(1, 4):
        _, norm, _ = step([batch(i)])
        norms.append(float(norm))
    app.progress.update(step=3)
    ck.save(3, app)  # returns once staged; steps 4-6 must not leak into it
    in_flight = ck.in_flight()
    losses = [float(step([batch(i)])[0]) for i in range(4, 7)]
    ck.close()
    expected = state_of(model, step.optimizer)
    master = step.optimizer.state[next(model.parameters())]["master"]

    fresh, again = build(seed=7)
    app2 = AppState(fresh, again.optimizer, again.scheduler, rank=rank, world_size=world)
    ck2 = Checkpointer(run_dir, CheckpointConfig(), rank=rank, world_size=world)
    report = ck2.load(ck2.resolve_resume("auto"), app2)
    resumed_losses = [float(again([batch(i)])[0]) for i in range(4, 7)]
    got = state_of(fresh, again.optimizer)
    differ = sorted(k for k in expected if not torch.equal(expected[k], got[k]))
    keys = list(read_metadata(report.path).state_dict_metadata)
    result = {
        "losses": losses, "resumed_losses": resumed_losses, "norms": norms, "differ": differ,
        "compared": len(expected), "resumed_step": report.step, "async_in_flight": in_flight,
        "master_type": type(master).__name__, "master_dtype": str(master.dtype),
        "master_placements": [type(p).__name__ for p in master.placements],
        "master_keys": sum(k.endswith(".master") for k in keys),
        "timing": ck.times.summary(),
    }
    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    finish({"ranks": gathered}, out)


if __name__ == "__main__":
    main(sys.argv[1])
