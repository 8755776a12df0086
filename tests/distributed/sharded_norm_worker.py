"""The rank side of test_sharded_norm: FSDP2-sharded gradients on gloo, kiln's local-shard norm
and clipping against torch's clip_grad_norm_ on the same gradients, reported as JSON."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from gloo_ranks import finish


def main(out: str) -> None:
    from torch.distributed.fsdp import fully_shard

    from kiln.distributed.sharded_norm import clip_grad_norm, total_norm

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def sharded_model():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(24, 33), torch.nn.GELU(), torch.nn.Linear(33, 7))
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        torch.manual_seed(1 + rank)
        model(torch.randn(5, 24)).square().sum().backward()
        return model

    a, b = sharded_model(), sharded_model()
    grads = [p.grad for p in a.parameters()]
    mine_norm = total_norm(grads)
    torch_norm = torch.nn.utils.get_total_norm(grads, foreach=True).full_tensor()
    clipped_norm = clip_grad_norm(list(a.parameters()), 0.5)
    torch.nn.utils.clip_grad_norm_(list(b.parameters()), 0.5, foreach=True)
    max_diff = max(float((pa.grad.full_tensor() - pb.grad.full_tensor()).abs().max())
                   for pa, pb in zip(a.parameters(), b.parameters()))
    # Which gradients take the local path: sharded ones, as their own local tensors; a replicated
    # one (alone or among sharded ones) sends the whole list to torch.
    from torch.distributed.tensor import Replicate, distribute_tensor

    from kiln.distributed.sharded_norm import _sharded_locals

    with torch.no_grad():
        local, _ = _sharded_locals(grads)
        replicated = distribute_tensor(torch.ones(4), grads[0].device_mesh, [Replicate()])
        paths = {"locals_are_to_local": all(x is g.to_local() for x, g in zip(local, grads)),
                 "replicated_alone": _sharded_locals([replicated]) is None,
                 "replicated_among_sharded": _sharded_locals([*grads, replicated]) is None}
    report = {"norm": float(mine_norm), "torch_norm": float(torch_norm), "clip_returned": float(clipped_norm),
              "max_grad_diff": max_diff, "plain": type(mine_norm).__name__, "paths": paths}
    finish(report, out)


if __name__ == "__main__":
    main(sys.argv[1])
