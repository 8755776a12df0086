"""`DecoderConfig`: what kiln's decoder needs to know, read from a Hugging Face `config.json`.

kiln reads the JSON itself (no transformers needed) and accepts the Llama family: `llama`
(Llama 2/3.x, incl. Llama-3 RoPE scaling), `mistral` (sliding window), `qwen2` (q/k/v biases,
optional sliding window on upper layers) and `qwen3` (per-head q/k RMSNorm). Both config
spellings are read: transformers 4.x (`rope_theta`, `rope_scaling`) and 5.x (`rope_parameters`).
Anything the decoder would compute differently from the checkpoint's own model is refused with
a `ConfigError` naming the field, never silently approximated.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.config.errors import ConfigError
from kiln.llm.presets import PRESETS

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3")
SPEC_FORMS = (*PRESETS, "path/to/config.json", "path/to/model_dir")
# transformers' defaults when a config.json leaves the field out.
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768, "qwen3": 32768}


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    """Base of the rotary frequencies."""
    kind: str = "default"
    """`default`, `linear` (positions divided by `factor`) or `llama3` (Llama 3.1 frequency bands)."""
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192


@dataclass(frozen=True)
class DecoderConfig:
    family: str
    """`model_type` of the checkpoint: one of FAMILIES."""
    vocab_size: int
    dim: int
    """Width of the residual stream (`hidden_size`)."""
    n_layers: int
    n_heads: int
    n_kv_heads: int
    """Key/value heads; fewer than `n_heads` is grouped-query attention."""
    head_dim: int
    ffn_dim: int
    """Inner width of the gated MLP (`intermediate_size`)."""
    norm_eps: float
    rope: RopeConfig
    max_positions: int
    """Longest sequence the model was built for (`max_position_embeddings`)."""
    tie_embeddings: bool
    """The output head reuses the token embedding matrix."""
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    """Qwen3: RMSNorm over each head's query and key before RoPE."""
    windows: tuple[int | None, ...] = ()
    """Per layer: sliding attention window in tokens, or None for full attention."""
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    initializer_range: float = 0.02
    dtype: str | None = None
    """The checkpoint's `torch_dtype`/`dtype`, if it says."""

    @property
    def n_groups(self) -> int:
        return self.n_heads // self.n_kv_heads

    def layer_window(self, i: int) -> int | None:
        return self.windows[i] if self.windows else None


def _int(raw: dict[str, Any], name: str, key: str, default: int | None = None) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(key, f"config field {name!r} must be a positive integer, got {value!r}")
    return value


def _rope(raw: dict[str, Any], key: str) -> RopeConfig:
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        raise ConfigError(key, "per-layer-type rope_parameters are not supported by kiln's decoder")
    if isinstance(params, dict):  # transformers 5: theta and scaling in one dict
        theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
        scaling: dict[str, Any] = params
    else:  # transformers 4: rope_theta + optional rope_scaling
        theta = raw.get("rope_theta", 10000.0)
        scaling = raw.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if kind not in ROPE_TYPES:
        raise ConfigError(key, f"rope type {kind!r} is not supported by kiln's decoder", ROPE_TYPES)
    partial = raw.get("partial_rotary_factor", scaling.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ConfigError(key, f"partial_rotary_factor {partial!r} is not supported (only 1.0)")
    factor = float(scaling.get("factor", 1.0) or 1.0)
    if kind in ("linear", "llama3") and factor <= 0:
        raise ConfigError(key, f"rope scaling factor must be > 0, got {factor}")
    return RopeConfig(
        theta=float(theta),
        kind=kind,
        factor=factor,
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_positions=int(scaling.get("original_max_position_embeddings", 8192)),
    )


def _windows(raw: dict[str, Any], family: str, n_layers: int, key: str) -> tuple[int | None, ...]:
    if family == "llama":
        return ()
    if family == "mistral":
        # MistralConfig's default window is 4096 when the field is absent (null turns it off).
        window = raw.get("sliding_window", 4096)
        return (window,) * n_layers if window else ()
    # qwen2/qwen3: a window only with use_sliding_window, on the layers layer_types marks
    # (by default those at or above max_window_layers).
    window = raw.get("sliding_window") if raw.get("use_sliding_window", False) else None
    if not window:
        return ()
    types = raw.get("layer_types")
    if types is None:
        start = raw.get("max_window_layers", 28)
        types = ["sliding_attention" if i >= start else "full_attention" for i in range(n_layers)]
    if len(types) != n_layers:
        raise ConfigError(key, f"layer_types has {len(types)} entries for {n_layers} layers")
    return tuple(window if t == "sliding_attention" else None for t in types)


def config_from_dict(raw: dict[str, Any], key: str = "--model") -> DecoderConfig:
    """A DecoderConfig from `config.json` fields; ConfigError(key, ...) for what kiln cannot run."""
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise ConfigError(key, f"model_type {family!r} is not a decoder kiln runs", FAMILIES)
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(key, f"hidden_act {act!r} is not supported (Llama-family MLPs use 'silu')")
    dim = _int(raw, "hidden_size", key)
    n_heads = _int(raw, "num_attention_heads", key)
    n_kv_heads = _int(raw, "num_key_value_heads", key, n_heads)
    if n_heads % n_kv_heads:
        raise ConfigError(key, f"num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv_heads}")
    # Qwen3's config class defaults head_dim to 128; the others derive it from the width.
    head_dim = raw.get("head_dim") or (128 if family == "qwen3" else dim // n_heads)
    n_layers = _int(raw, "num_hidden_layers", key)
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    if family == "qwen2":  # Qwen2 has q/k/v biases and no output bias, whatever the config says
        qkv_bias, out_bias = True, False
    else:
        qkv_bias = out_bias = bool(raw.get("attention_bias", False))
    return DecoderConfig(
        family=family,
        vocab_size=_int(raw, "vocab_size", key),
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=_int({"head_dim": head_dim}, "head_dim", key),
        ffn_dim=_int(raw, "intermediate_size", key),
        norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope=_rope(raw, key),
        max_positions=_int(raw, "max_position_embeddings", key, _DEFAULT_MAX_POSITIONS[family]),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        out_bias=out_bias,
        mlp_bias=bool(raw.get("mlp_bias", False)) if family == "llama" else False,
        qk_norm=family == "qwen3",
        windows=_windows(raw, family, n_layers, key),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=tuple(int(t) for t in eos_ids),
        initializer_range=float(raw.get("initializer_range", 0.02)),
        dtype=raw.get("torch_dtype") or raw.get("dtype"),
    )


def read_config_json(path: Path, key: str = "--model") -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(key, f"cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(key, f"{path} is not a config.json object")
    return raw


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: its config fields, and the directory holding its files, if any."""

    spec: str
    raw: dict[str, Any]
    directory: Path | None
    """The model directory (weights, tokenizer); None for a preset or a bare config.json."""

    @property
    def config(self) -> DecoderConfig:
        return config_from_dict(self.raw)


MODEL_PREFIXES = ("hf:", "llama:")
"""Prefixes `kiln train model.name=...` uses for these models; accepted here too, so one name
means one model across commands."""


def preset_config(name: str) -> dict[str, Any] | None:
    """The `config.json` fields of preset `name`, or None: the public Llama shapes of
    kiln.llm.presets and the tiny test shapes `kiln train model.name=hf:NAME` knows
    (kiln.models.hf.PRESETS, a superset), so every preset name train accepts means the same model here."""
    if name in PRESETS:
        return dict(PRESETS[name])
    from kiln.models.hf import PRESETS as TRAIN_PRESETS  # imported late: it needs torch.nn

    return dict(TRAIN_PRESETS[name]) if name in TRAIN_PRESETS else None


def preset_names() -> list[str]:
    from kiln.models.hf import PRESETS as TRAIN_PRESETS

    return list(dict.fromkeys([*PRESETS, *TRAIN_PRESETS]))


def resolve_model(spec: str, key: str = "--model") -> ModelSource:
    """A preset name, a `config.json` path or a local model directory (an `hf:` or `llama:` prefix,
    as in `kiln train model.name=hf:llama-tiny`, is allowed). A preset of a family kiln's decoder
    does not run (gpt2-tiny) is refused by `config_from_dict`, naming its model_type."""
    name = next((spec[len(p):] for p in MODEL_PREFIXES if spec.startswith(p)), spec)
    preset = preset_config(name)
    path = Path(name).expanduser()
    if preset is not None:
        source = ModelSource(spec, preset, None)
    elif path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise ConfigError(key, f"directory {path.resolve()} has no config.json")
        source = ModelSource(spec, read_config_json(cfg, key), path)
    elif path.is_file():
        source = ModelSource(spec, read_config_json(path, key), None)
    else:
        presets = preset_names()
        close = difflib.get_close_matches(name, presets, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(key, f"{spec!r} is not a preset and no file or directory {path.resolve()} exists{hint}",
                          (*presets, "path/to/config.json", "path/to/model_dir"))
    config_from_dict(source.raw, key)  # refuse an unsupported model here, before anything is built
    return source
