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
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.config.errors import ConfigError
from kiln.llm.hf_config import PRESETS as HF_PRESETS
from kiln.llm.presets import PRESETS
from kiln.safe_io import read_json

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3")
# transformers' defaults (its LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config) for the fields a
# config.json may leave out; a field absent from here and from the file is refused. An explicit
# `null` is not "absent": null key/value heads means as many as query heads, as in transformers.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"max_position_embeddings": 2048, "num_key_value_heads": None, "bos_token_id": 1, "eos_token_id": 2},
    "mistral": {"max_position_embeddings": 4096 * 32, "num_key_value_heads": 8, "bos_token_id": 1,
                "eos_token_id": 2, "sliding_window": 4096},
    "qwen2": {"max_position_embeddings": 32768, "num_key_value_heads": 32, "bos_token_id": None,
              "eos_token_id": None, "sliding_window": 4096, "max_window_layers": 28},
    "qwen3": {"max_position_embeddings": 32768, "num_key_value_heads": 32, "bos_token_id": None,
              "eos_token_id": None, "sliding_window": 4096, "max_window_layers": 28, "head_dim": 128},
}
# Fields every family defaults the same way.
COMMON_DEFAULTS: dict[str, Any] = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                                   "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
                                   "use_sliding_window": False, "initializer_range": 0.02}
# RoPE scaling fields transformers requires (it raises KeyError without them); kiln refuses too.
_ROPE_REQUIRED = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor")}


def _field(raw: dict[str, Any], family: str, name: str) -> Any:
    """`raw[name]`, else transformers' default for the family."""
    if name in raw:
        return raw[name]
    return FAMILY_DEFAULTS[family].get(name, COMMON_DEFAULTS.get(name))


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
    """`llama3`: the context the model was pretrained with; config.json's
    `original_max_position_embeddings`, else (as transformers does) `max_position_embeddings`."""


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
    return _positive(raw.get(name, default), name, key)


SIZE_LIMITS = {"num_hidden_layers": 1024, "hidden_size": 1 << 17, "intermediate_size": 1 << 19,
               "num_attention_heads": 1024, "num_key_value_heads": 1024, "head_dim": 4096, "vocab_size": 1 << 23,
               "max_position_embeddings": 1 << 27, "sliding_window": 1 << 27}
"""Upper bounds on config.json sizes, far above any published model (405B: 126 layers, hidden 16384):
a config that asks for more is a mistake or an attack, refused before memory is allocated for it."""


def _positive(value: Any, name: str, key: str) -> int:
    """`value` of config field `name`, which must be a positive integer (within SIZE_LIMITS)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(key, f"config field {name!r} must be a positive integer, got {value!r}")
    limit = SIZE_LIMITS.get(name)
    if limit is not None and value > limit:
        raise ConfigError(key, f"config field {name!r} is {value}, more than the {limit} kiln accepts")
    return value


def _real(value: Any, name: str, key: str, *, below: float | None = None) -> float:
    """`value` of config field `name`, which must be a finite number > 0 (and < `below`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0 \
            or (below is not None and value >= below):
        bound = f" below {below}" if below is not None else ""
        raise ConfigError(key, f"config field {name!r} must be a positive number{bound}, got {value!r}")
    return float(value)


def _rope(raw: dict[str, Any], family: str, max_positions: int, key: str) -> RopeConfig:
    """RoPE as transformers standardizes it: `rope_scaling` (4.x) over `rope_parameters` (5.x); the
    theta inside that dict over the top-level `rope_theta`."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        raise ConfigError(key, "per-layer-type rope_parameters are not supported by kiln's decoder")
    scaling: dict[str, Any] = raw.get("rope_scaling") or (params if isinstance(params, dict) else None) or {}
    theta = _real(scaling.get("rope_theta", _field(raw, family, "rope_theta")), "rope_theta", key)
    kind = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if kind not in ROPE_TYPES:
        raise ConfigError(key, f"rope type {kind!r} is not supported by kiln's decoder", ROPE_TYPES)
    missing = [f for f in _ROPE_REQUIRED.get(kind, ()) if scaling.get(f) is None]
    if missing:
        raise ConfigError(key, f"{kind} rope scaling without {', '.join(missing)} (transformers refuses it too)")
    partial = raw.get("partial_rotary_factor", scaling.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ConfigError(key, f"partial_rotary_factor {partial!r} is not supported (only 1.0)")
    factor = float(scaling.get("factor", 1.0)) if kind != "default" else 1.0
    if kind in ("linear", "llama3") and factor <= 0:
        raise ConfigError(key, f"rope scaling factor must be > 0, got {factor}")
    original = scaling.get("original_max_position_embeddings") or max_positions
    return RopeConfig(
        theta=float(theta),
        kind=kind,
        factor=factor,
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_positions=int(original),
    )


def _windows(raw: dict[str, Any], family: str, n_layers: int, key: str) -> tuple[int | None, ...]:
    if family == "llama":
        return ()
    window = _field(raw, family, "sliding_window")  # absent: 4096; null (or 0) turns windows off
    window = _positive(window, "sliding_window", key) if window else None
    if family == "mistral":  # every layer, whatever layer_types says (transformers ignores it)
        return (window,) * n_layers if window else ()
    # qwen2/qwen3: a window only with use_sliding_window, on the layers layer_types marks
    # (by default those at or above max_window_layers).
    if not _field(raw, family, "use_sliding_window") or not window:
        return ()
    types = raw.get("layer_types")
    if types is None:
        start = _field(raw, family, "max_window_layers")
        types = ["sliding_attention" if i >= start else "full_attention" for i in range(n_layers)]
    if len(types) != n_layers:
        raise ConfigError(key, f"layer_types has {len(types)} entries for {n_layers} layers")
    return tuple(window if t == "sliding_attention" else None for t in types)


def config_from_dict(raw: dict[str, Any], key: str = "--model") -> DecoderConfig:
    """A DecoderConfig from `config.json` fields; ConfigError(key, ...) for what kiln cannot run.
    A field the file leaves out takes transformers' default for the family (FAMILY_DEFAULTS,
    COMMON_DEFAULTS) or, where transformers' default is a whole model size, is refused."""
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise ConfigError(key, f"model_type {family!r} is not a decoder kiln runs", FAMILIES)
    act = _field(raw, family, "hidden_act")
    if act != "silu":
        raise ConfigError(key, f"hidden_act {act!r} is not supported (Llama-family MLPs use 'silu')")
    dim = _int(raw, "hidden_size", key)
    n_heads = _int(raw, "num_attention_heads", key)
    n_kv_heads = _field(raw, family, "num_key_value_heads")
    n_kv_heads = _positive(n_heads if n_kv_heads is None else n_kv_heads, "num_key_value_heads", key)
    if n_heads % n_kv_heads:
        raise ConfigError(key, f"num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv_heads}"
                          + ("" if "num_key_value_heads" in raw else
                             f" ({family}'s default when config.json leaves it out)"))
    head_dim = _field(raw, family, "head_dim")
    if head_dim is None:
        if "head_dim" in raw and family in ("qwen2", "qwen3"):  # transformers' attention would fail on it
            raise ConfigError(key, f"head_dim is null, which {family} models cannot run with")
        head_dim = dim // n_heads
    n_layers = _int(raw, "num_hidden_layers", key)
    max_positions = _positive(_field(raw, family, "max_position_embeddings"), "max_position_embeddings", key)
    eos = _field(raw, family, "eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    if family == "qwen2":  # Qwen2 has q/k/v biases and no output bias, whatever the config says
        qkv_bias, out_bias = True, False
    elif family == "mistral":  # Mistral's attention has no biases, whatever the config says
        qkv_bias = out_bias = False
    else:
        qkv_bias = out_bias = bool(_field(raw, family, "attention_bias"))
    return DecoderConfig(
        family=family,
        vocab_size=_int(raw, "vocab_size", key),
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=_int({"head_dim": head_dim}, "head_dim", key),
        ffn_dim=_int(raw, "intermediate_size", key),
        norm_eps=_real(_field(raw, family, "rms_norm_eps"), "rms_norm_eps", key, below=1.0),
        rope=_rope(raw, family, max_positions, key),
        max_positions=max_positions,
        tie_embeddings=bool(_field(raw, family, "tie_word_embeddings")),
        qkv_bias=qkv_bias,
        out_bias=out_bias,
        mlp_bias=bool(_field(raw, family, "mlp_bias")) if family == "llama" else False,
        qk_norm=family == "qwen3",
        windows=_windows(raw, family, n_layers, key),
        bos_token_id=_field(raw, family, "bos_token_id"),
        eos_token_ids=tuple(int(t) for t in eos_ids),
        initializer_range=_real(_field(raw, family, "initializer_range"), "initializer_range", key),
        dtype=raw.get("torch_dtype") or raw.get("dtype"),
    )


def read_config_json(path: Path, key: str = "--model") -> dict[str, Any]:
    if path.suffix in (".safetensors", ".pt", ".bin", ".distcp"):
        # A weights file alone (`kiln export --out model.safetensors`) says nothing of the model's shape.
        raise ConfigError(key, f"{path} is a weights file: pass a model directory (config.json beside its "
                          "*.safetensors, as `kiln export RUN --out DIR` writes) or a config.json")
    try:
        raw = read_json(path, 16 << 20, follow=True)  # a regular file of at most 16 MiB
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(key, f"cannot read {path} as a config.json: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(key, f"{path} is not a config.json object")
    return raw


def has_weights(directory: Path | None) -> bool:
    """`directory` holds safetensors weights (one file, or an index of shards)."""
    return directory is not None and (any(directory.glob("*.safetensors"))
                                      or (directory / "model.safetensors.index.json").is_file())


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
    (kiln.llm.hf_config.PRESETS, a superset), so every preset name train accepts means the same model here."""
    if name in PRESETS:
        return dict(PRESETS[name])
    return dict(HF_PRESETS[name]) if name in HF_PRESETS else None


def preset_names() -> list[str]:
    return list(dict.fromkeys([*PRESETS, *HF_PRESETS]))


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
            if (path / "config.toml").is_file() and (path / "checkpoints").is_dir():  # `kiln train`'s run dir
                raise ConfigError(key, f"{path} is a kiln run dir, not a model directory: export it first "
                                  f"(kiln export {path} --out {path / 'hf'}), then pass {path / 'hf'}")
            raise ConfigError(key, f"directory {path.resolve()} has no config.json")
        source = ModelSource(spec, read_config_json(cfg, key), path)
        if not has_weights(path) and any(path.glob("pytorch_model*.bin")):  # never random weights instead
            raise ConfigError(key, f"{path} holds pytorch_model*.bin weights only: kiln loads safetensors only, which "
                              "never unpickle code (convert them with transformers' save_pretrained(..., "
                              "safe_serialization=True)), or pass its config.json for random weights")
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
