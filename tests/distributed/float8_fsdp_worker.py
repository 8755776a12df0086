"""The rank side of test_float8_fsdp: torchao float8 (emulated matmuls, so it runs on CPU) under
FSDP2 through kiln's float8 path: which layers convert, whether their weights are all-gathered in
float8, and whether the per-step scale precompute runs after the optimizer step. JSON report."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from gloo_ranks import finish


def run(recipe: str) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from kiln.train.float8 import apply_float8, float8_gathered, install_scale_precompute

    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)) for _ in range(2)]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(32, 16)).to(torch.bfloat16)  # the head stays bf16
    converted = apply_float8(model, blocks, recipe, fsdp=True, emulate=True)
    configs = {m.config.enable_fsdp_float8_all_gather for m in model.modules() if hasattr(m, "config")}
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    import torchao.float8

    real, calls = torchao.float8.precompute_float8_dynamic_scale_for_fsdp, []

    def counted(module):
        calls.append(module is model)
        real(module)

    torchao.float8.precompute_float8_dynamic_scale_for_fsdp = counted  # what kiln imports when it installs the hook
    try:
        installed = install_scale_precompute(model, optimizer)
    finally:
        torchao.float8.precompute_float8_dynamic_scale_for_fsdp = real
    float8_weights = [m.weight for m in model.modules() if type(m).__name__ == "Float8Linear"]
    before = sum(getattr(w._local_tensor, "_precomputed_scale", None) is not None for w in float8_weights)
    losses = []
    for step in range(2):
        gen = torch.Generator().manual_seed(10 * step + dist.get_rank())
        loss = model(torch.randn(8, 32, generator=gen).to(torch.bfloat16)).float().square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    scales = [getattr(w._local_tensor, "_precomputed_scale", None) for w in float8_weights]
    return {"converted": converted, "all_gather_flags": sorted(configs), "gathered": float8_gathered(model),
            "installed": installed, "precompute_calls": calls, "scales_before": before,
            "scales_set": sum(s is not None for s in scales), "float8_weights": len(float8_weights),
            "head": type(model[2]).__name__, "losses_finite": all(torch.isfinite(torch.tensor(losses)).tolist())}


def main(out: str) -> None:
    dist.init_process_group("gloo")
    finish({recipe: run(recipe) for recipe in ("tensorwise", "rowwise")}, out)


if __name__ == "__main__":
    main(sys.argv[1])
