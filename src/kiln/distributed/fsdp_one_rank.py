"""FSDP2 at world size 1: a unit's parameters gathered with one fused copy instead of one per parameter.

With one rank there is nothing to all-gather, and torch's `FSDPParamGroup.wait_for_unshard` (torch
2.11 to 2.13, torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, branch
`if world_size == 1:`) fills each unsharded parameter from its shard one parameter at a time:
`fsdp_param.all_gather_inputs` (a cast to the param dtype: a new tensor and a kernel),
`init_all_gather_outputs`, `alloc_storage`, and `tensor.copy_(all_gather_input)` (a second kernel)
inside its own `_unsafe_preserve_version_counter`. With more ranks the same unit costs one fused
copy-out. For a model of many small parameters that loop is the largest FSDP2 host cost, a cast
and a copy per parameter, enough for a one-GPU FSDP2 step to wait for its host (the
fsdp_host_overhead results, row fsdp-unit6-auto).

`install_one_rank_unshard(model)` gives each param group of a one-rank FSDP2 model its own
`wait_for_unshard` (an instance attribute; torch calls it as `self.wait_for_unshard()`) that does
the same work with one `torch._foreach_copy_(outputs, shards)`: the cast to the param dtype and the
copy in one op (on CUDA one multi-tensor kernel when the group's shards share a dtype, as FSDP2's
own copy-in does; on CPU a C++ loop), no cast temporaries, one version-counter guard for the group.
The values are the same: `copy_` into a bf16/fp16 tensor rounds as `.to(dtype)` does. The rest
of torch's method (implicit-prefetch bookkeeping, `init_unsharded_param`, `_to_unsharded`, the
copy-out event) is kept call for call. What it saves is measured by benchmarks/fsdp_one_rank_copy.py
(a unit's unshard + wait + reshard on CPU, interleaved with torch's own) and, on a GPU, by the
scale_1gpu_fused_copy results (one-rank FSDP2 against DDP).

It is installed only where it is known to replace that code exactly: the group's all-gather group
has one rank, torch's `wait_for_unshard` still has the per-parameter loop (read from its source)
and the attributes used below, and no parameter uses CPU offload or all-gather extensions
(`fsdp_pre_all_gather`, e.g. float8). At call time it defers to torch's method while dynamo
traces (compiled autograd / traced FSDP hooks) and for a group resharded to a post-forward mesh.
Otherwise torch is left alone and kiln logs why, once.
"""

from __future__ import annotations

import functools
import inspect
import logging
import types

import torch

log = logging.getLogger("kiln.distributed")

# Lines of torch's world-size-1 branch that this module replaces; if torch rewrites the branch the
# fast path stays off until it is checked against the new code.
_REPLACED_SOURCE = ("if world_size == 1:", "init_all_gather_outputs(", "tensor.copy_(all_gather_input)")
_GROUP_ATTRS = ("wait_for_unshard", "_to_unsharded", "_wait_all_gather_streams_on_event", "is_sharded")
_GROUP_INSTANCE_ATTRS = ("_all_gather_result", "_training_state", "comm_ctx", "fsdp_params", "device",
                         "device_handle", "mesh_info")
# (FSDPParam.param_dtype is used too, but set only at FSDP2's lazy init, in the first forward.)
_PARAM_INSTANCE_ATTRS = ("all_gather_outputs", "_sharded_param_data", "offload_to_cpu", "init_all_gather_outputs",
                         "init_unsharded_param")


@functools.cache
def torch_problem() -> str | None:
    """Why this torch's FSDP2 code is not the shape the fast path replaces; None when it is."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
        from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, TrainingState  # noqa: F401
    except ImportError as e:
        return f"torch {torch.__version__} lacks the FSDP2 internals it relies on ({e})"
    group_cls = _fsdp_param_group.FSDPParamGroup
    missing = [a for a in _GROUP_ATTRS if not hasattr(group_cls, a)]
    if not hasattr(_fsdp_param, "alloc_storage") or not hasattr(torch, "_foreach_copy_"):
        missing.append("alloc_storage / torch._foreach_copy_")
    if missing:
        return f"torch {torch.__version__}'s FSDPParamGroup lacks {missing}"
    try:
        source = inspect.getsource(group_cls.wait_for_unshard)
    except (OSError, TypeError) as e:
        return f"the source of torch {torch.__version__}'s wait_for_unshard cannot be read ({e})"
    absent = [line for line in _REPLACED_SOURCE if line not in source]
    if absent:
        return f"torch {torch.__version__}'s wait_for_unshard no longer has the per-parameter copy ({absent} absent)"
    return None


@functools.cache
def _log_once(reason: str) -> None:
    log.info("FSDP2: one-rank fused copy off, torch's per-parameter copy kept: %s", reason)


def fsdp_param_groups(model: torch.nn.Module) -> list:
    """The FSDPParamGroups of a fully_shard-ed model, each once (a unit of several modules shares one)."""
    from torch.distributed.fsdp import FSDPModule

    groups, seen = [], set()
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        # torch 2.13 keeps a list (per-parameter meshes); 2.11 one group or None.
        found = getattr(state, "_fsdp_param_groups", None)
        if found is None:
            found = [state._fsdp_param_group]
        for group in found:
            if group is not None and id(group) not in seen:
                seen.add(id(group))
                groups.append(group)
    return groups


def _group_problem(group) -> str | None:
    """Why this group keeps torch's copy ('' when only because it has more than one rank)."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo

    missing = [a for a in _GROUP_INSTANCE_ATTRS if not hasattr(group, a)]
    if missing:
        return f"an FSDPParamGroup lacks {missing}"
    if not isinstance(group.mesh_info, FSDPMeshInfo) or group._all_gather_process_group.size() != 1:
        return ""
    for fsdp_param in group.fsdp_params:
        missing = [a for a in _PARAM_INSTANCE_ATTRS if not hasattr(fsdp_param, a)]
        if missing:
            return f"an FSDPParam lacks {missing}"
        if fsdp_param.offload_to_cpu:
            return "CPU offload (torch moves each shard to the device first)"
        if hasattr(fsdp_param._sharded_local_tensor, "fsdp_pre_all_gather"):
            return "a parameter with all-gather extensions (fsdp_pre_all_gather)"
    return None


def install_one_rank_unshard(model: torch.nn.Module) -> int:
    """Give every one-rank param group of `model` the fused `wait_for_unshard`; the number of groups
    that got it (0 with more ranks, or where torch's code differs: then logged once)."""
    reason = torch_problem()
    if reason is not None:
        _log_once(reason)
        return 0
    installed = 0
    for group in fsdp_param_groups(model):
        problem = _group_problem(group)
        if problem:
            _log_once(problem)
        if problem is not None:
            continue
        group.wait_for_unshard = types.MethodType(wait_for_unshard_one_rank, group)
        installed += 1
    return installed


def wait_for_unshard_one_rank(group) -> None:
    """torch's `FSDPParamGroup.wait_for_unshard` at world size 1, the copies fused (see the module
    docstring); what it leaves behind is what torch's leaves."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    from torch.distributed.fsdp._fully_shard._fsdp_param import alloc_storage

    if not group._all_gather_result:
        return  # no preceding unshard
    if not group.is_sharded or torch.compiler.is_compiling():
        # Resharded to a post-forward mesh, or traced by dynamo: torch's own code.
        return type(group).wait_for_unshard(group)
    if group._training_state == TrainingState.FORWARD:  # implicit prefetch
        if prev_all_gather_state := group.comm_ctx.all_gather_state:
            group._wait_all_gather_streams_on_event(prev_all_gather_state.event)
            group.comm_ctx.all_gather_state = None  # free the all-gather result
    outputs, shards = [], []
    for fsdp_param in group.fsdp_params:
        # The shard (all_gather_inputs without its cast: the copy casts), into the output torch
        # would allocate for it: one flat tensor of the param dtype.
        shard = fsdp_param._sharded_param_data
        fsdp_param.init_all_gather_outputs([shard.numel()], [fsdp_param.param_dtype or shard.dtype], 1, group.device)
        output = fsdp_param.all_gather_outputs[0]
        alloc_storage(output)
        outputs.append(output)
        shards.append(shard)
    # The outputs back parameters that autograd may have saved in forward; refilling them for
    # backward must not look like an in-place change (as in torch's loop).
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(tuple(outputs)):
        torch._foreach_copy_(outputs, shards)
    for fsdp_param in group.fsdp_params:
        fsdp_param.init_unsharded_param()
    group._to_unsharded()
    all_gather_copy_out_event = group.device_handle.Event()
    all_gather_copy_out_event.record()
    group._wait_all_gather_streams_on_event(all_gather_copy_out_event)
    group._all_gather_result = None
