"""Causal LMs from Hugging Face transformers, built from a config and never downloaded.

`hf:<spec>`: a kiln preset (exact shapes of a public model, random weights), a path to a
`config.json`, or a local directory with `config.json` (and weights, loaded when present).
The model is returned unwrapped: HF models return an output object and kiln's causal-LM loss
reads `.logits` from it. transformers is imported inside the functions (optional dependency).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from kiln.errors import ConfigError
from kiln.llm.hf_config import PRESETS, dtype_kwarg, import_transformers, make_config
from kiln.llm.weights import has_weights
from kiln.models.blocks import find_repeated_blocks
from kiln.models.spec import BuiltModel, InputSpec

# Default sequence length for InputSpec; other configs use min(max_position_embeddings, 1024).
PRESET_SEQ_LEN = {"llama-tiny": 256, "gpt2-tiny": 256}
DEFAULT_SEQ_LEN = 1024
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# Where the decoder layers live, by family; find_repeated_blocks covers the rest.
_LAYER_PATHS = ("model.layers", "transformer.h", "model.decoder.layers", "gpt_neox.layers", "transformer.blocks")

SPEC_FORMS = (*(f"hf:{p}" for p in PRESETS), "hf:path/to/config.json", "hf:path/to/model_dir")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError("model.name", f"cannot read HF config {path}: {e}") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ConfigError("model.name", f"{path} is not a transformers config.json (no 'model_type')")
    return raw


def resolve_spec(spec: str) -> tuple[dict[str, Any], Path | None, int | None]:
    """(raw config fields, directory to load weights from or None, preset seq_len or None)."""
    if spec in PRESETS:
        return dict(PRESETS[spec]), None, PRESET_SEQ_LEN.get(spec)
    if not spec.strip():
        raise ConfigError("model.name", "'hf:' needs a preset, config.json or directory after it", SPEC_FORMS)
    # Relative paths resolve against the current directory, like every other path in a config.
    path = Path(spec).expanduser()
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ConfigError("model.name", f"directory {path.resolve()} has no config.json")
        has_weights = any((path / f).is_file() for f in WEIGHT_FILES)
        return _read_json(config_file), (path if has_weights else None), None
    if path.is_file():
        return _read_json(path), None, None
    close = difflib.get_close_matches(spec, list(PRESETS), n=1)
    hint = f"; did you mean 'hf:{close[0]}'?" if close else ""
    raise ConfigError(
        "model.name",
        f"'hf:{spec}' is not a kiln preset and no file or directory {path.resolve()} exists{hint}",
        SPEC_FORMS,
    )


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    for path in _LAYER_PATHS:
        obj: Any = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, (nn.ModuleList, nn.Sequential)) and len(obj) > 0:
            return list(obj)
    return find_repeated_blocks(model)


def build_hf(spec: str, kwargs: dict[str, Any], name: str) -> BuiltModel:
    transformers = import_transformers(name)
    raw, weights_dir, preset_seq_len = resolve_spec(spec)
    config = make_config(raw, kwargs, name)
    # Weights stay fp32: the precision policy (precision.py) casts for bf16-true, and the mixed
    # policies need fp32 master weights; transformers 5 would otherwise load a bf16 checkpoint
    # as bf16 (its from_pretrained default is dtype="auto").
    dtype = dtype_kwarg(transformers, torch.float32)
    # "sdpa": torch's fused attention kernels, which torch.compile handles without graph breaks.
    if weights_dir is not None and not has_weights(Path(weights_dir)):
        # pytorch_model.bin is a pickle: loading it could run code from the model dir.
        raise ConfigError("model.name", f"{weights_dir} has pytorch_model.bin but no *.safetensors: kiln loads "
                          "safetensors only, which never unpickle code (convert it with safetensors' convert tool)")
    try:
        if weights_dir is not None:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(weights_dir), config=config, local_files_only=True, attn_implementation="sdpa",
                use_safetensors=True, **dtype
            )
        else:
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", **dtype)
    except ValueError as e:
        if "Unrecognized configuration class" in str(e):
            raise ConfigError(
                "model.name", f"{name!r}: model_type {raw['model_type']!r} has no causal-LM class in transformers"
            ) from None
        raise
    if "use_cache" not in kwargs:
        # Training never reads the KV cache a forward builds by default; building it costs memory
        # and time on every step (and graph outputs under compile).
        model.config.use_cache = False
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab_size = int(text_config.vocab_size)
    max_pos = getattr(text_config, "max_position_embeddings", None)
    seq_len = preset_seq_len or DEFAULT_SEQ_LEN
    if max_pos:  # never longer than the model's positions (a kwarg may have shrunk them)
        seq_len = min(seq_len, int(max_pos))
    # config.json as save_pretrained writes it, for `kiln export --out DIR` (generation uses the cache).
    hf_config = {**json.loads(model.config.to_json_string(use_diff=False)), "use_cache": True}
    return BuiltModel(
        module=model,
        task="causal_lm",
        input_spec=InputSpec("tokens", (seq_len,), vocab_size=vocab_size, max_seq_len=int(max_pos) if max_pos else None),
        name=name,
        blocks=decoder_layers(model),
        hf_config=hf_config,
    )
