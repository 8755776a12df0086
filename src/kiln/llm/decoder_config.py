"""`DecoderConfig`: what kiln's decoder needs to know of a model, whatever family it comes from.

A family's spec (kiln.llm.family) reads a checkpoint's `config.json` into one of these;
kiln.llm.model builds from it. Plain data: no parsing here, so the model code and every family
module can import it without importing the family table.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    """`model_type` of the checkpoint: a key of kiln.llm.families.FAMILIES (its spec)."""
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
