"""The rank side of test_one_rank_unshard: kiln's FSDP2 training step on one gloo rank, trained from the
same start with kiln's fused one-rank copy and with torch's per-parameter copy, for each precision
and resharding case; the losses, final parameters and which code ran, reported as JSON."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from gloo_ranks import finish

STEPS = 4
BASE = ["model.name=vit", "model.kwargs.img_size=16", "model.kwargs.patch_size=8", "model.kwargs.embed_dim=16",
        "model.kwargs.depth=4", "model.kwargs.num_heads=2", "model.kwargs.num_classes=5", "data.batch_size=2",
        "training.device=cpu", "compile.enabled=false", "distributed.strategy=fsdp", "distributed.fsdp_unit_blocks=2",
        "training.grad_clip=1.0"]


def run(fused: bool, precision: str, reshard: str, accum: int) -> dict:
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    from kiln.config import load_config
    from kiln.data import build_data
    from kiln.distributed.fsdp_one_rank import fsdp_param_groups
    from kiln.models import build_model
    from kiln.precision import apply_precision, resolve_precision
    from kiln.train.assemble import build_train_step

    device = torch.device("cpu")
    cfg = load_config(None, [*BASE, f"precision.policy={precision}", f"distributed.fsdp_reshard_after_forward={reshard}",
                             f"distributed.fsdp_one_rank_fused_copy={str(fused).lower()}",
                             f"training.grad_accum_steps={accum}"])
    policy = resolve_precision(cfg.precision.policy, device)
    torch.manual_seed(0)
    built = build_model(cfg.model)
    model = apply_precision(built.module, policy)
    step = build_train_step(model, built.task, built.blocks, cfg, policy, device, strategy="fsdp")

    # Which wait_for_unshard ran: torch's (the class's) or kiln's (set on each group).
    calls = {"torch": 0, "kiln": 0}
    torch_wait = FSDPParamGroup.wait_for_unshard

    def counted_torch(group):
        calls["torch"] += 1
        return torch_wait(group)

    FSDPParamGroup.wait_for_unshard = counted_torch
    for group in fsdp_param_groups(step.model):
        if "wait_for_unshard" in vars(group):
            kiln_wait = group.wait_for_unshard

            def counted_kiln(kiln_wait=kiln_wait):
                calls["kiln"] += 1
                return kiln_wait()

            group.wait_for_unshard = counted_kiln
    batches = iter(build_data(cfg.data, built.input_spec, device=device, seed=0))
    losses = []
    try:
        for _ in range(STEPS):
            mean, _norm, _flag = step([next(batches) for _ in range(accum)])
            losses.append(float(mean))
    finally:
        FSDPParamGroup.wait_for_unshard = torch_wait
    # The dtype the parameters were gathered in (the buffers stay, their storage freed or not).
    gathered_dtypes = {str(p.all_gather_outputs[0].dtype) for g in fsdp_param_groups(step.model) for p in g.fsdp_params}
    params = {n: p.full_tensor().float().tolist() for n, p in step.model.named_parameters()}
    return {"losses": losses, "params": params, "calls": calls, "layout": step.model.kiln_fsdp_layout,
            "gathered_dtypes": sorted(gathered_dtypes)}


def main(out: str) -> None:
    dist.init_process_group("gloo")
    report = {"world_size": dist.get_world_size()}
    for precision in ("fp32", "bf16-mixed"):
        for reshard in ("true", "false"):
            for accum in (1, 2):
                name = f"{precision}/reshard={reshard}/accum={accum}"
                report[name] = {"torch": run(False, precision, reshard, accum),
                                "kiln": run(True, precision, reshard, accum)}
    finish(report, out)


if __name__ == "__main__":
    main(sys.argv[1])
