"""The rank side of test_traffic: real DDP and FSDP2 wrappers on gloo, reporting what they built
(DDP's rebuilt buckets, FSDP2's units and resharding, explicit, `auto` and as a memory plan
decided it, compiled-block state_dict keys) as JSON."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from gloo_ranks import finish

from kiln.config import load_config
from kiln.distributed.apply import apply_parallel
from kiln.models import build_model
from kiln.precision import resolve_precision

OVERRIDES = ["model.kwargs.hidden_size=256", "model.kwargs.num_layers=6", "model.kwargs.num_classes=10",
             "model.kwargs.dropout=0.0", "distributed.ddp_bucket_cap_mb=0.5", "training.device=cpu"]


def _model(cfg):
    torch.manual_seed(0)
    return build_model(cfg.model)


def main(out: str) -> None:
    dist.init_process_group("gloo")
    device = torch.device("cpu")
    report: dict = {}
    cfg = load_config(None, [*OVERRIDES, "distributed.strategy=ddp"])
    built = _model(cfg)
    policy = resolve_precision(cfg.precision.policy, device)
    ddp, _ = apply_parallel(built.module, built.blocks, cfg, policy, device, "ddp")
    x = torch.randn(4, *built.input_spec.shape)
    for _ in range(3):  # DDP rebuilds its buckets after the first backward
        ddp(x).sum().backward()
    report["ddp_buckets"] = [b.buffer().numel() * b.buffer().element_size()
                             for b in ddp.reducer._get_zeros_like_grad_buckets()]

    fsdp = [*OVERRIDES, "distributed.strategy=fsdp", "distributed.fsdp_unit_blocks=2"]
    cfg = load_config(None, [*fsdp, "distributed.fsdp_reshard_after_forward=true", "distributed.fsdp_forward_prefetch=1",
                             "distributed.fsdp_backward_prefetch=2",
                             "compile.enabled=true", "compile.backend=eager"])
    built = _model(cfg)
    keys = sorted(built.module.state_dict())
    sharded, _ = apply_parallel(built.module, built.blocks, cfg, policy, device, "fsdp")
    sharded(x).sum().backward()
    report["state_dict_keys_kept"] = sorted(sharded.state_dict()) == keys
    report["fsdp_units"] = _units(sharded)
    # The default reshard rule (`auto`) on this small model: nothing resharded after forward.
    cfg = load_config(None, fsdp)
    built = _model(cfg)
    sharded, _ = apply_parallel(built.module, built.blocks, cfg, policy, device, "fsdp")
    sharded(x).sum().backward()
    report["fsdp_units_auto"] = _units(sharded)
    # The memory plan's decision passed in (kiln.train.gpu_plan.planned_reshard) overrides the size
    # rule; ranks whose plans differ (rank 1 alone reshards) agree on resharding.
    for name, planned in (("fsdp_units_planned", True), ("fsdp_units_disagreeing", dist.get_rank() == 1)):
        built = _model(cfg)
        sharded, _ = apply_parallel(built.module, built.blocks, cfg, policy, device, "fsdp", None, planned)
        sharded(x).sum().backward()
        report[name] = _units(sharded)
    finish(report, out)


def _units(sharded) -> list[dict]:
    units, seen = [], set()
    for module in sharded.modules():
        state = getattr(module, "_get_fsdp_state", None)
        if state is None:
            continue
        group = module._get_fsdp_state()._fsdp_param_group
        if group is None or module is sharded or id(group) in seen:
            continue
        seen.add(id(group))
        units.append({"params": sum(p._sharded_param_data.numel() for p in group.fsdp_params) * dist.get_world_size(),
                      "reshard": group.post_forward_mesh_info is not None,
                      "prefetches": len(module._get_fsdp_state()._states_to_forward_prefetch),
                      "backward_prefetches": len(module._get_fsdp_state()._states_to_backward_prefetch)})
    return units


if __name__ == "__main__":
    main(sys.argv[1])
