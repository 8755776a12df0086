"""`FamilySpec`: everything kiln knows about one model family, in one frozen record.

A family is what a checkpoint's `config.json` names in `model_type` (`llama`, `qwen3`, ...). Its
spec says how to read that config into a `DecoderConfig`, which module to build from it, how its
parameters map onto Hugging Face's tensor names (the state-dict adapter loading and `kiln export`
use), which projections weight-only quantization replaces, its presets, the config fields
`model.kwargs` may override, which of kiln's kernels its modules can take, and which model each
benchmark peer runs for it. kiln.llm.families holds the one table of specs; every command looks a
family up there instead of knowing it (docs/extension.md: adding a family).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kiln.llm.decoder_config import DecoderConfig
from kiln.llm.model import Decoder

Kernel = Literal["swiglu", "decode_attention", "decode_matvec", "int4_triton"]
"""kiln kernels a family's modules can take: `swiglu` (training's fused SwiGLU, kiln.train.swiglu:
its MLP is kiln's FeedForward), `decode_attention` (flash / Triton decode attention,
kiln.llm.kernels: kiln's Attention), `decode_matvec` (fused matrix-vector decode projections:
kiln's Block with the SwiGLU FeedForward), `int4_triton` (int4@triton with norms folded into the
projections after them, kiln.llm.quant)."""


@dataclass(frozen=True)
class FamilySpec:
    name: str
    """The `model_type` of the family's config.json (the table's key)."""
    parse_config: Callable[[dict[str, Any], str], DecoderConfig]
    """config.json fields -> DecoderConfig; a ConfigError naming the key (2nd argument) for what
    kiln cannot run exactly as the checkpoint's own model does."""
    build: Callable[[DecoderConfig], Decoder]
    """The module for a config, under the caller's device context (`meta` for shapes only): kiln's
    Decoder or a subclass of it (another Block: another MLP or norm)."""
    hf_names: Callable[[DecoderConfig], dict[str, tuple[str, ...]]]
    """The state-dict adapter: kiln parameter name -> the HF tensor names it is made of
    (concatenated along dim 0 in this order)."""
    hf_splits: Callable[[DecoderConfig], dict[str, list[int]]]
    """Rows each HF tensor takes in a fused kiln parameter, by the parameter's module name (`wqkv`)."""
    projections: Callable[[DecoderConfig], dict[str, tuple[int, int]]]
    """(out, in) features of each projection of a block that weight-only quantization replaces, by
    its path in the block (`attn.wqkv`); the output head is added by kiln.llm.quant."""
    hf_architecture: str
    """transformers' class for the family (config.json `architectures`; what HF peers load)."""
    config_fields: tuple[str, ...]
    """config.json fields the family reads: what `model.kwargs` may override."""
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Preset name -> config.json fields (random weights; `--model NAME`, `llama:NAME`)."""
    kernels: frozenset[Kernel] = frozenset()
    """kiln kernels its modules can take (see `Kernel`)."""
    peers: Mapping[str, str] = field(default_factory=dict)
    """Benchmark peer -> the peer's model for this family (`{"torchtitan": "llama3"}`); `kiln bench
    train-llm`'s torchtitan row skips a family that does not name it."""
