"""float8 training through torchao (`precision.float8`), applied from outside the model.

torchao's `convert_to_float8_training` swaps `nn.Linear` modules for `Float8Linear`, whose
matmuls run on float8 tensor cores with dynamic scales (`tensorwise`: one scale per tensor;
`rowwise`: one per row, more accurate, a little slower). Only the linear layers inside the
repeated blocks are converted, and only those whose dimensions are multiples of 16 (what the
float8 matmul takes): the output layer stays in bf16, as in torchtitan, since the logits are the
most precision-sensitive matmul (and a fused cross-entropy reads its weight directly).

Parameters stay ordinary tensors (float8 is a compute format here), so checkpoints, export and
resume are unchanged.

Under FSDP2 the `tensorwise` recipe also all-gathers the weights in float8 (torchao's
`enable_fsdp_float8_all_gather`: each shard is cast before the all-gather, half the bytes of bf16)
and, after every optimizer step, computes all those weights' scales with one all-reduce
(`precompute_float8_dynamic_scale_for_fsdp`) instead of one per weight in each all-gather.
`rowwise` gathers in bf16: torchao's float8 all-gather takes tensorwise scales only (one scale per
tensor survives sharding; a row's scale would need the whole row).
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from kiln.errors import ConfigError

RECIPES = ("none", "tensorwise", "rowwise")
INSTALL_HINT = "pip install 'kiln[quant]' (torchao)"
MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9) and Hopper (9.0) or newer
FSDP_FLOAT8_ALL_GATHER = ("tensorwise",)
"""The recipes whose weights FSDP2 all-gathers in float8 (torchao: tensorwise scaling only)."""

log = logging.getLogger("kiln.train")


def check_float8(recipe: str, device: torch.device, policy_name: str) -> None:
    """ConfigError (exit 2, before any work) when `precision.float8=recipe` cannot run here."""
    if recipe == "none":
        return
    if recipe not in RECIPES:
        raise ConfigError("precision.float8", f"unknown value {recipe!r}", RECIPES)
    if device.type != "cuda":
        raise ConfigError("precision.float8", f"float8 training needs a CUDA GPU with float8 tensor cores "
                          f"(compute capability >= 8.9: Ada, Hopper); this run is on {device.type}", ("none",))
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        raise ConfigError("precision.float8", f"{torch.cuda.get_device_name(device)} (compute capability "
                          f"{capability[0]}.{capability[1]}) has no float8 tensor cores; they need >= 8.9 "
                          "(Ada, Hopper)", ("none",))
    if policy_name not in ("bf16-mixed", "bf16-true", "bf16-master"):
        raise ConfigError("precision.float8", f"float8 matmuls take bf16 activations; precision.policy is "
                          f"{policy_name!r}", ("bf16-mixed", "bf16-true", "bf16-master"))
    _import_float8()


def _import_float8():
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:
        raise ConfigError("precision.float8", f"float8 training needs torchao, which does not import ({exc}); "
                          f"{INSTALL_HINT}", ("none",)) from None
    return Float8LinearConfig, convert_to_float8_training


def float8_eligible(module: torch.nn.Module) -> bool:
    return (isinstance(module, torch.nn.Linear) and module.in_features % 16 == 0
            and module.out_features % 16 == 0)


def float8_config(recipe: str, *, fsdp: bool, emulate: bool = False):
    """torchao's Float8LinearConfig of `recipe`; `fsdp`: the weights will be FSDP2-sharded, so a
    recipe of FSDP_FLOAT8_ALL_GATHER gathers them in float8. `emulate`: torchao's emulated
    float8 matmuls (runs on CPU; tests)."""
    Float8LinearConfig, _ = _import_float8()
    config = Float8LinearConfig.from_recipe_name(recipe)
    changes = {"enable_fsdp_float8_all_gather": fsdp and recipe in FSDP_FLOAT8_ALL_GATHER}
    if emulate:
        changes["emulate"] = True
    return dataclasses.replace(config, **changes)


def apply_float8(model: torch.nn.Module, blocks: list[torch.nn.Module], recipe: str, *, fsdp: bool = False,
                 emulate: bool = False) -> int:
    """Convert the eligible linear layers inside `blocks` to float8 training; returns how many.
    `fsdp`: FSDP2 shards the model next (see float8_config)."""
    if recipe == "none":
        return 0
    _, convert_to_float8_training = _import_float8()
    targets = {id(m) for block in blocks for m in block.modules() if float8_eligible(m)}
    if not targets:
        return 0
    config = float8_config(recipe, fsdp=fsdp, emulate=emulate)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda module, fqn: id(module) in targets)
    if fsdp and recipe not in FSDP_FLOAT8_ALL_GATHER:
        log.info("float8 %s under FSDP2: weights are all-gathered in bf16 (torchao gathers float8 for %s only)",
                 recipe, ", ".join(FSDP_FLOAT8_ALL_GATHER))
    return len(targets)


def float8_gathered(model: torch.nn.Module) -> int:
    """How many of the model's FSDP2-sharded weights are all-gathered in float8."""
    return sum(1 for p in model.parameters() if type(getattr(p, "_local_tensor", None)).__name__
               == "WeightWithDynamicFloat8CastTensor")


def install_scale_precompute(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    """After every optimizer step, the float8 scales of all the weights FSDP2 gathers in float8,
    in one all-reduce (torchao's precompute_float8_dynamic_scale_for_fsdp, what torchtitan runs
    after its step). False (nothing installed) when no weight is gathered in float8. Without it
    each all-gather computes its weight's scale itself: the same values, one all-reduce each."""
    if not float8_gathered(model):
        return False
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    optimizer.register_step_post_hook(lambda opt, args, kwargs: precompute_float8_dynamic_scale_for_fsdp(model))
    return True
