"""`timm:<name>`: any timm model, random init (pretrained weights would need the network).

timm is optional and imported inside the function; the error says which extra installs it.
Written against timm 1.x (`create_model`, `is_model`, `pretrained_cfg`).
"""

from __future__ import annotations

import difflib
from typing import Any

import torch.nn as nn

from kiln.errors import ConfigError
from kiln.models.blocks import find_repeated_blocks
from kiln.models.spec import BuiltModel, InputSpec

INSTALL_HINT = "pip install 'kiln[vision]'"
# PyPI's torchvision wheels (timm needs torchvision) are CUDA builds that break a CPU-only torch.
CPU_INSTALL_HINT = ("this torch is a CPU build: pip install torchvision --index-url https://download.pytorch.org/whl/cpu, "
                    "then pip install timm (not 'kiln[vision]': PyPI's torchvision is a CUDA build that breaks CPU torch)")


def install_hint() -> str:
    """How to install timm for this torch: the extra on a CUDA build, torchvision's CPU wheel first otherwise."""
    import torch

    return INSTALL_HINT if torch.version.cuda or torch.version.hip else CPU_INSTALL_HINT


def _image_shape(model: nn.Module, kwargs: dict[str, Any]) -> tuple[int, int, int]:
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
    c, h, w = tuple(cfg.get("input_size", (3, 224, 224)))
    # pretrained_cfg describes the pretrained weights, not overrides: img_size/in_chans passed as
    # kwargs change the model but not that dict, so they win here.
    c = int(kwargs.get("in_chans", c))
    size = kwargs.get("img_size")
    if isinstance(size, int):
        h = w = size
    elif isinstance(size, (list, tuple)) and len(size) == 2:
        h, w = int(size[0]), int(size[1])
    return c, int(h), int(w)


def build_timm(model_name: str, kwargs: dict[str, Any], name: str) -> BuiltModel:
    try:
        import timm
    except ImportError as e:
        raise ConfigError("model.name", f"{name!r} needs timm, which is not installed ({e}); {install_hint()}") from None
    if not timm.is_model(model_name):
        close = difflib.get_close_matches(model_name, timm.list_models(), n=8, cutoff=0.5)
        raise ConfigError(
            "model.name",
            f"timm has no model {model_name!r} (list them with timm.list_models())",
            [f"timm:{c}" for c in close] or None,
        )
    if "pretrained" in kwargs:
        raise ConfigError("model.kwargs.pretrained", "kiln builds timm models with random weights (no downloads)")
    try:
        model = timm.create_model(model_name, pretrained=False, **kwargs)
    except TypeError as e:
        # timm forwards kwargs to the model class; an unknown one surfaces as a TypeError there.
        raise ConfigError("model.kwargs", f"timm model {model_name!r} rejected the arguments: {e}") from None
    num_classes = getattr(model, "num_classes", None)
    if num_classes is None:
        num_classes = (getattr(model, "pretrained_cfg", None) or {}).get("num_classes")
    blocks_attr = getattr(model, "blocks", None)
    if isinstance(blocks_attr, (nn.ModuleList, nn.Sequential)) and len(blocks_attr) > 0:
        blocks = list(blocks_attr)
    else:
        blocks = find_repeated_blocks(model)
    return BuiltModel(
        module=model,
        task="classification",
        # num_classes=0 is timm's "no head" (feature extractor): no classes to score.
        input_spec=InputSpec(
            "images", _image_shape(model, kwargs), num_classes=int(num_classes) if num_classes else None
        ),
        name=name,
        blocks=blocks,
    )
