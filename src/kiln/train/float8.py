"""float8 training through torchao (`precision.float8`), applied from outside the model.

torchao's `convert_to_float8_training` swaps `nn.Linear` modules for `Float8Linear`, whose
matmuls run on float8 tensor cores with dynamic scales (`tensorwise`: one scale per tensor;
`rowwise`: one per row, more accurate, a little slower). Only the linear layers inside the
repeated blocks are converted, and only those whose dimensions are multiples of 16 (what the
float8 matmul takes): the output layer stays in bf16, as in torchtitan, since the logits are the
most precision-sensitive matmul (and a fused cross-entropy reads its weight directly).

Parameters stay ordinary tensors (float8 is a compute format here), so checkpoints, export and
resume are unchanged.
"""

from __future__ import annotations

import torch

from kiln.config.errors import ConfigError

RECIPES = ("none", "tensorwise", "rowwise")
INSTALL_HINT = "pip install 'kiln[quant]' (torchao)"
MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9) and Hopper (9.0) or newer


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


def apply_float8(model: torch.nn.Module, blocks: list[torch.nn.Module], recipe: str) -> int:
    """Convert the eligible linear layers inside `blocks` to float8 training; returns how many."""
    if recipe == "none":
        return 0
    Float8LinearConfig, convert_to_float8_training = _import_float8()
    targets = {id(m) for block in blocks for m in block.modules() if float8_eligible(m)}
    if not targets:
        return 0
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=lambda module, fqn: id(module) in targets)
    return len(targets)
