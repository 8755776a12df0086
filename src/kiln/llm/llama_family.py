"""The Llama family: `llama` (Llama 2/3.x, incl. Llama-3 RoPE scaling), `mistral` (sliding window),
`qwen2` (q/k/v biases, optional sliding window on upper layers) and `qwen3` (per-head q/k RMSNorm).

Four specs sharing one parser, one name map and one module (kiln.llm.model.Decoder): transformers
has a model_type (and a class) for each, and they differ only in defaults and in which optional
parts (biases, q/k norms, windows) the config turns on. Both config spellings are read:
transformers 4.x (`rope_theta`, `rope_scaling`) and 5.x (`rope_parameters`). Anything the decoder
would compute differently from the checkpoint's own model is refused with a `ConfigError` naming
the field, never silently approximated.

HF names map onto kiln's modules as follows (q/k/v and gate/up are concatenated along the output
dimension into kiln's fused projections):

    model.embed_tokens                      -> embed
    model.layers.N.input_layernorm          -> layers.N.attn_norm
    model.layers.N.self_attn.{q,k,v}_proj   -> layers.N.attn.wqkv
    model.layers.N.self_attn.o_proj         -> layers.N.attn.wo
    model.layers.N.self_attn.{q,k}_norm     -> layers.N.attn.{q,k}_norm          (Qwen3)
    model.layers.N.post_attention_layernorm -> layers.N.ffn_norm
    model.layers.N.mlp.{gate,up}_proj       -> layers.N.ffn.w_gate_up
    model.layers.N.mlp.down_proj            -> layers.N.ffn.w_down
    model.norm                              -> norm
    lm_head                                 -> lm_head   (absent when tied to the embedding)
"""

from __future__ import annotations

from typing import Any

from kiln.errors import ConfigError
from kiln.llm.config_fields import positive, positive_field, real, rope_config
from kiln.llm.decoder_config import DecoderConfig
from kiln.llm.family import FamilySpec
from kiln.llm.model import Decoder
from kiln.llm.presets import PRESETS

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

CONFIG_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "tie_word_embeddings", "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window",
    "max_window_layers", "layer_types", "bos_token_id", "eos_token_id", "initializer_range", "hidden_act",
    "partial_rotary_factor", "torch_dtype", "dtype",
)
"""The config.json fields `parse_config` reads: what `model.kwargs` may override."""


def _field(raw: dict[str, Any], family: str, name: str) -> Any:
    """`raw[name]`, else transformers' default for the family."""
    if name in raw:
        return raw[name]
    return FAMILY_DEFAULTS[family].get(name, COMMON_DEFAULTS.get(name))


def _windows(raw: dict[str, Any], family: str, n_layers: int, key: str) -> tuple[int | None, ...]:
    if family == "llama":
        return ()
    window = _field(raw, family, "sliding_window")  # absent: 4096; null (or 0) turns windows off
    window = positive(window, "sliding_window", key) if window else None
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


def parse_config(raw: dict[str, Any], key: str = "--model") -> DecoderConfig:
    """A DecoderConfig from the `config.json` fields of a Llama-family checkpoint (`model_type`
    one of FAMILY_DEFAULTS). A field the file leaves out takes transformers' default for the
    family (FAMILY_DEFAULTS, COMMON_DEFAULTS) or, where transformers' default is a whole model
    size, is refused."""
    family = raw["model_type"]
    act = _field(raw, family, "hidden_act")
    if act != "silu":
        raise ConfigError(key, f"hidden_act {act!r} is not supported (Llama-family MLPs use 'silu')")
    dim = positive_field(raw, "hidden_size", key)
    n_heads = positive_field(raw, "num_attention_heads", key)
    n_kv_heads = _field(raw, family, "num_key_value_heads")
    n_kv_heads = positive(n_heads if n_kv_heads is None else n_kv_heads, "num_key_value_heads", key)
    if n_heads % n_kv_heads:
        raise ConfigError(key, f"num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv_heads}"
                          + ("" if "num_key_value_heads" in raw else
                             f" ({family}'s default when config.json leaves it out)"))
    head_dim = _field(raw, family, "head_dim")
    if head_dim is None:
        if "head_dim" in raw and family in ("qwen2", "qwen3"):  # transformers' attention would fail on it
            raise ConfigError(key, f"head_dim is null, which {family} models cannot run with")
        head_dim = dim // n_heads
    n_layers = positive_field(raw, "num_hidden_layers", key)
    max_positions = positive(_field(raw, family, "max_position_embeddings"), "max_position_embeddings", key)
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
        vocab_size=positive_field(raw, "vocab_size", key),
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=positive(head_dim, "head_dim", key),
        ffn_dim=positive_field(raw, "intermediate_size", key),
        norm_eps=real(_field(raw, family, "rms_norm_eps"), "rms_norm_eps", key, below=1.0),
        rope=rope_config(raw, _field(raw, family, "rope_theta"), max_positions, key),
        max_positions=max_positions,
        tie_embeddings=bool(_field(raw, family, "tie_word_embeddings")),
        qkv_bias=qkv_bias,
        out_bias=out_bias,
        mlp_bias=bool(_field(raw, family, "mlp_bias")) if family == "llama" else False,
        qk_norm=family == "qwen3",
        windows=_windows(raw, family, n_layers, key),
        bos_token_id=_field(raw, family, "bos_token_id"),
        eos_token_ids=tuple(int(t) for t in eos_ids),
        initializer_range=real(_field(raw, family, "initializer_range"), "initializer_range", key),
        dtype=raw.get("torch_dtype") or raw.get("dtype"),
    )


def hf_names(config: DecoderConfig) -> dict[str, tuple[str, ...]]:
    """kiln parameter name -> the HF tensor names it is made of (concatenated in this order)."""
    names: dict[str, tuple[str, ...]] = {"embed.weight": ("model.embed_tokens.weight",), "norm.weight": ("model.norm.weight",)}
    if not config.tie_embeddings:
        names["lm_head.weight"] = ("lm_head.weight",)
    for i in range(config.n_layers):
        hf, kn = f"model.layers.{i}.", f"layers.{i}."
        names[kn + "attn_norm.weight"] = (hf + "input_layernorm.weight",)
        names[kn + "ffn_norm.weight"] = (hf + "post_attention_layernorm.weight",)
        names[kn + "attn.wqkv.weight"] = tuple(f"{hf}self_attn.{p}_proj.weight" for p in "qkv")
        names[kn + "attn.wo.weight"] = (hf + "self_attn.o_proj.weight",)
        if config.qkv_bias:
            names[kn + "attn.wqkv.bias"] = tuple(f"{hf}self_attn.{p}_proj.bias" for p in "qkv")
        if config.out_bias:
            names[kn + "attn.wo.bias"] = (hf + "self_attn.o_proj.bias",)
        if config.qk_norm:
            names[kn + "attn.q_norm.weight"] = (hf + "self_attn.q_norm.weight",)
            names[kn + "attn.k_norm.weight"] = (hf + "self_attn.k_norm.weight",)
        names[kn + "ffn.w_gate_up.weight"] = (hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight")
        names[kn + "ffn.w_down.weight"] = (hf + "mlp.down_proj.weight",)
        if config.mlp_bias:
            names[kn + "ffn.w_gate_up.bias"] = (hf + "mlp.gate_proj.bias", hf + "mlp.up_proj.bias")
            names[kn + "ffn.w_down.bias"] = (hf + "mlp.down_proj.bias",)
    return names


def hf_splits(config: DecoderConfig) -> dict[str, list[int]]:
    """Rows of q, k, v in `wqkv` and of gate, up in `w_gate_up`."""
    q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    return {"wqkv": [q, kv, kv], "w_gate_up": [config.ffn_dim, config.ffn_dim]}


def projections(config: DecoderConfig) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each projection of a block."""
    q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    return {"attn.wqkv": (q + 2 * kv, config.dim), "attn.wo": (config.dim, q),
            "ffn.w_gate_up": (2 * config.ffn_dim, config.dim), "ffn.w_down": (config.dim, config.ffn_dim)}


def _spec(name: str, architecture: str, peers: dict[str, str] | None = None) -> FamilySpec:
    return FamilySpec(
        name=name, parse_config=parse_config, build=Decoder, hf_names=hf_names, hf_splits=hf_splits,
        projections=projections, hf_architecture=architecture, config_fields=CONFIG_FIELDS,
        presets={p: fields for p, fields in PRESETS.items() if fields["model_type"] == name},
        kernels=frozenset({"swiglu", "decode_attention", "decode_matvec", "int4_triton"}), peers=peers or {},
    )


LLAMA = _spec("llama", "LlamaForCausalLM", {"torchtitan": "llama3"})
MISTRAL = _spec("mistral", "MistralForCausalLM")
QWEN2 = _spec("qwen2", "Qwen2ForCausalLM")
QWEN3 = _spec("qwen3", "Qwen3ForCausalLM")
SPECS = (LLAMA, MISTRAL, QWEN2, QWEN3)
