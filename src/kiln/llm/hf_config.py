"""transformers configs for kiln's model names: the preset table `hf:` training models and kiln's
own decoder share (so one preset name means one model in every command), and a config built from
raw `config.json` fields with `model.kwargs` overrides. transformers is an optional dependency,
imported inside the functions with an install hint.
"""

from __future__ import annotations

import copy
import difflib
import inspect
from typing import TYPE_CHECKING, Any

from kiln.errors import ConfigError
from kiln.llm.presets import PRESETS as LLM_PRESETS

if TYPE_CHECKING:
    import torch

INSTALL_HINT = "pip install 'kiln[llm]'"


# Presets: config fields passed to AutoConfig.for_model (model_type first). Fields use the names
# transformers 4.x accepts (rope_theta, rope_scaling); transformers 5 folds them into
# `rope_parameters` itself, so one table serves both (and kiln.llm's own decoder).
PRESETS: dict[str, dict[str, Any]] = {
    # Public Llama shapes (llama-3.2-1b, llama-3.2-3b, llama-3.1-8b): one table with kiln.llm.
    **LLM_PRESETS,
    # Tiny shapes for tests and smoke runs: builds and steps in milliseconds on CPU (llama-tiny is
    # in kiln.llm.presets, so kiln's own decoder has it too).
    "gpt2-tiny": {
        "model_type": "gpt2",
        "vocab_size": 512,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 256,
        # GPT-2's default special ids (50256) lie outside a 512-token vocabulary.
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
}


def import_transformers(name: str):
    try:
        import transformers
    except ImportError as e:
        raise ConfigError(
            "model.name", f"{name!r} needs transformers, which is not installed ({e}); {INSTALL_HINT}"
        ) from None
    return transformers


def make_config(raw: dict[str, Any], kwargs: dict[str, Any], name: str):
    """A transformers config from raw fields with `model.kwargs` applied.

    kwargs are merged into the fields *before* the config is constructed, so derived fields
    (e.g. llama's head_dim = hidden_size // num_attention_heads) follow an override.
    """
    transformers = import_transformers(name)
    # transformers writes its own defaults into nested dicts it is given (a llama3 rope_scaling
    # gains original_max_position_embeddings): each call gets its own copy, so `raw` (a preset, a
    # caller's config.json) keeps what it said and a later reading of it sees the same fields.
    fields = {k: v for k, v in raw.items() if k != "model_type"}
    model_type = raw["model_type"]
    if "model_type" in kwargs:
        raise ConfigError(
            "model.kwargs.model_type", "cannot change the architecture; point model.name at another config"
        )
    try:
        base = transformers.AutoConfig.for_model(model_type, **copy.deepcopy(fields))
    except ValueError as e:
        known = sorted(transformers.CONFIG_MAPPING.keys())
        if model_type not in known:
            raise ConfigError("model.name", f"transformers has no model_type {model_type!r}", known) from None
        raise ConfigError("model.name", f"invalid HF config for {name!r}: {e}") from None
    init_params = set(inspect.signature(type(base).__init__).parameters)
    for key in kwargs:
        # Accept attributes (incl. aliases such as gpt2's hidden_size -> n_embd), constructor
        # arguments, and fields of the raw config (legacy names like rope_theta).
        is_field = hasattr(base, key) and not callable(getattr(base, key))
        if not (is_field or key in init_params or key in fields):
            valid = sorted(k for k in base.to_dict() if not k.startswith("_"))
            close = difflib.get_close_matches(key, valid, n=3)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"model.kwargs.{key}", f"{type(base).__name__} has no field {key!r}{hint}", close or valid
            )
    if not kwargs:
        return base
    try:
        return transformers.AutoConfig.for_model(model_type, **copy.deepcopy({**fields, **kwargs}))
    except (ValueError, TypeError) as e:
        raise ConfigError("model.kwargs", f"{type(base).__name__} rejected the overrides: {e}") from None


def dtype_kwarg(transformers, dtype: torch.dtype) -> dict[str, Any]:
    # transformers 5 renamed torch_dtype to dtype (4.56+ accepts both, 4.45 only torch_dtype).
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}
