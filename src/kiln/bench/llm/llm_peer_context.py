"""What a peer of `kiln bench llm` is given (kiln.bench.peers.interface): the checked plan, kiln's
decoder (the weights every row runs), where and since when the bench runs, the ceilings measured on
the spot, the KV-cache bytes a decode step reads per batch size, and the bench's own rows, to set
the peer's figures against them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the peers' table imports this, and `kiln bench train-llm` reads that table
    import torch

    from kiln.bench.ceilings import Ceilings
    from kiln.bench.llm.llm_options import LlmBenchOptions, LlmBenchPlan
    from kiln.bench.llm.llm_rows import LlmRow
    from kiln.llm.config import DecoderConfig
    from kiln.llm.model import Decoder


@dataclass(frozen=True)
class LlmPeerRequest:
    """What a peer's `check` reads: the request as given and the model's config (no weights)."""

    opts: LlmBenchOptions
    config: DecoderConfig


@dataclass
class LlmPeerContext:
    plan: LlmBenchPlan
    kiln_model: Decoder | None
    """None when kiln's model could not be built (a peer then reports its rows as skipped)."""
    device: torch.device
    started: float
    """The performance counter's reading when the bench started (for --end-by-s)."""
    log: Callable[[str], None]
    ceilings: Ceilings | None
    kv_bytes: dict[int, int]
    """Batch size -> KV-cache bytes a decode step reads (kiln.bench.formulas.kv_bytes_per_step)."""
    bench_rows: dict[str, LlmRow]
    """The bench's own rows (kiln's engines and transformers'), by name: a peer reads their figures
    (`.row`, kiln.bench.llm.llm_engine_row.EngineRow) and sets its own against them in `.row.against_peers`."""
