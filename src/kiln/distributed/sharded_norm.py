"""Gradient norm and clipping on FSDP2's local shards: one all-reduce instead of DTensor dispatch.

Under FSDP2 every gradient is a DTensor sharded on dim 0 across the ranks of a 1-D mesh, so the
global squared norm is the sum over ranks of each rank's local squared norm. Under HSDP (a 2-D
mesh: replicate x shard) the replicas hold equal gradients after FSDP2's all-reduce, so the sum
runs over the shard dimension's group only; in general over the groups of the mesh dimensions
the gradients are sharded on, one all-reduce each. torch's
`clip_grad_norm_` reaches the same number through DTensor dispatch, op by op and tensor by
tensor on the host (a per-parameter cost that grows with the parameter count and made up much of
FSDP2's host time per step at one rank; see the fsdp_host_overhead results). Here: two
foreach kernels on the local shards, one all-reduce of a scalar, one foreach scale. Gradients that
are not sharded DTensors (DDP, one process) go to torch's own functions unchanged.

Everything runs under no_grad: there `DTensor.to_local()` returns the local tensor itself; with
grad mode on it goes through an autograd Function per gradient, which cost more host time than
the norm (profiled on a 152-parameter ViT).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def _sharded_locals(grads: list[Tensor]) -> tuple[list[Tensor], list] | None:
    """(local shards, the process groups to sum squared norms over) when every gradient is a
    DTensor on one mesh, each mesh dimension Shard or Replicate, all laid out alike."""
    try:
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError:  # torch without public DTensor: not FSDP2
        return None
    if not grads or not all(isinstance(g, DTensor) for g in grads):
        return None
    mesh = grads[0].device_mesh
    kinds = tuple(isinstance(p, Shard) for p in grads[0].placements)
    # These checks run every step. FSDP2 hands each gradient its parameter's DTensorSpec, and its
    # parameters share a few spec objects (12 for the 152 of a ViT), so each spec is checked once.
    checked: set[int] = set()
    for g in grads:
        spec = g._spec
        if id(spec) in checked:
            continue
        if not (spec.mesh is mesh or spec.mesh == mesh) or not all(isinstance(p, (Shard, Replicate))
                                                                   for p in spec.placements):
            return None  # a Partial (unreduced) gradient or another mesh: leave it to torch
        if tuple(isinstance(p, Shard) for p in spec.placements) != kinds:
            return None  # mixed layouts would need a sum over different groups per tensor
        checked.add(id(spec))
    if not any(kinds):
        return None  # replicated everywhere: torch's path is one local norm already
    # Under no_grad (the callers') `to_local()` returns `_local_tensor` itself; reading it directly
    # skips a call per gradient.
    groups = [mesh.get_group(dim) for dim, sharded in enumerate(kinds) if sharded]
    return [g._local_tensor for g in grads], groups


def _local_norm(local: list[Tensor], groups: list) -> Tensor:
    """The global 2-norm from each rank's local shards (float32)."""
    present = [g for g in local if g.numel()]
    if present:
        # float32 norms straight from the kernel (no cast per gradient; bf16 grads accumulate in fp32)
        squared = torch.stack(torch._foreach_norm(present, 2, dtype=torch.float32)).square().sum()
    else:
        squared = torch.zeros((), device=local[0].device)
    for group in groups:
        dist.all_reduce(squared, group=group)
    return squared.sqrt()


@torch.no_grad()
def total_norm(grads: list[Tensor], *, fp32: bool = False) -> Tensor:
    """The global 2-norm of `grads` as a plain tensor, whatever their layout. `fp32`: computed and
    returned in float32 whatever the gradients' dtype (torch's get_total_norm returns a bf16 norm of
    bf16 gradients, too coarse for a clipping coefficient); FSDP2's sharded path always is."""
    sharded = _sharded_locals(grads)
    if sharded is None and fp32:
        present = [g for g in grads if g.numel()]
        if not present:
            return torch.zeros((), device=grads[0].device if grads else None)
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(present, 2, dtype=torch.float32)))
    if sharded is None:
        norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        full = getattr(norm, "full_tensor", None)
        return full() if callable(full) else norm
    return _local_norm(*sharded)


@torch.no_grad()
def clip_grad_norm(params: list[Tensor], max_norm: float) -> Tensor:
    """`torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)` with the sharded fast path;
    returns the total norm before clipping."""
    grads = [g for g in (p.grad for p in params) if g is not None]
    sharded = _sharded_locals(grads)
    if sharded is None:
        return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    local, groups = sharded
    norm = _local_norm(local, groups)
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    present = [g for g in local if g.numel()]
    if present:
        torch._foreach_mul_(present, coef.to(present[0].dtype))
    return norm
