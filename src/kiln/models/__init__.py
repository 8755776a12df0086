"""Models: the builtin registry (seed MLP, ViT), timm, HF causal LMs and user factories.

Model code here is single-device and plain; precision, checkpointing, compile and parallelism
are applied from outside by the apply_* transforms, which use `BuiltModel.blocks` as their unit.
"""

from __future__ import annotations

from kiln.models.blocks import find_repeated_blocks
from kiln.models.registry import NAME_FORMS, REGISTRY, build_model, known_models
from kiln.models.spec import BuiltModel, InputSpec

__all__ = [
    "NAME_FORMS",
    "REGISTRY",
    "BuiltModel",
    "InputSpec",
    "build_model",
    "find_repeated_blocks",
    "known_models",
]
