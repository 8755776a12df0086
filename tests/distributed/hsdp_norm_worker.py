"""The rank side of test_sharded_norm's HSDP case: FSDP2 on a 2 x 2 (replicate, shard) mesh on 4
gloo ranks; kiln's local-shard norm and clipping against torch's DTensor path. JSON report."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from gloo_ranks import finish


def main(out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from kiln.distributed.sharded_norm import _sharded_locals, clip_grad_norm, total_norm

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))

    def sharded_model():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(24, 33), torch.nn.GELU(), torch.nn.Linear(33, 7))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        torch.manual_seed(1 + rank)
        model(torch.randn(5, 24)).square().sum().backward()
        return model

    a, b = sharded_model(), sharded_model()
    grads = [p.grad for p in a.parameters()]
    with torch.no_grad():
        found = _sharded_locals(grads)
    mine = total_norm(grads)
    theirs = torch.nn.utils.get_total_norm(grads, foreach=True).full_tensor()
    clipped = clip_grad_norm(list(a.parameters()), 0.5)
    torch.nn.utils.clip_grad_norm_(list(b.parameters()), 0.5, foreach=True)
    max_diff = max(float((pa.grad.full_tensor() - pb.grad.full_tensor()).abs().max())
                   for pa, pb in zip(a.parameters(), b.parameters()))
    finish({"norm": float(mine), "torch_norm": float(theirs), "clip_returned": float(clipped),
            "max_grad_diff": max_diff, "placements": [type(p).__name__ for p in grads[0].placements],
            "local_path": found is not None, "groups": len(found[1]) if found else 0}, out)


if __name__ == "__main__":
    main(sys.argv[1])
