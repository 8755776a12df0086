"""A gpt-fast row of `kiln bench llm` as it passes from its process (process.py) to the peer's
steps (peer.py) and the bench: `GptFastRow.to_json()` is the row of results.json."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.bench.typed_row import UNSET, JsonRow

ENGINE = "gpt-fast"


@dataclass
class GptFastRow(JsonRow):
    """One gpt-fast row (one quantization at one batch size), its fields in results.json's order."""

    model: str = UNSET
    dtype: str = UNSET
    batch: int = UNSET
    prompt_len: int = UNSET
    new_tokens: int = UNSET
    engine: str = ENGINE
    quant: str = "none"
    """`none` or `int4` (process.QUANTS)."""
    peer_commit: str | None = UNSET
    peer_checkout: str = UNSET
    peer_quantize_command: str = UNSET
    """int4: the child run that wrote gpt-fast's int4 checkpoint through its quantize.py."""
    peer_quantize_s: float = UNSET
    peer_quantize_adaptations: list[str] = UNSET
    group_size: int | None = UNSET
    status: str = "ok"
    reason: str | None = None
    peer_command: str = UNSET
    # What gpt-fast printed (process.parse_output).
    peer_request_s_samples: list[float] = UNSET
    peer_tok_s_samples: list[float] = UNSET
    peer_avg_tok_s: float | None = UNSET
    peer_compile_s: float | None = UNSET
    peer_bandwidth_gbs: float | None = UNSET
    peer_memory_reserved_bytes: int | None = UNSET
    # What the child learned besides gpt-fast's own output (its KILN_PEER line).
    peer_stubbed_modules: list[str] = UNSET
    peer_adaptations: list[str] = UNSET
    peer_config_name: str = UNSET
    weight_bytes: int = UNSET
    # The bench's figures.
    request_tok_s: float = UNSET
    """New tokens per second over the whole request, every sequence of the batch (kiln's rows count alike)."""
    generate_s: float = UNSET
    label: str = UNSET
    roofline_basis: str = UNSET
    kv_bytes_per_step: int = UNSET
    step_bytes: int = UNSET
    achieved_gbs: float = UNSET
    roofline_frac: float | None = UNSET
    roofline_spec_frac: float | None = UNSET
    roofline_copy_frac: float | None = UNSET
