"""A kiln or HF engine row of `kiln bench llm` as its phases fill it (kiln.bench.llm.llm_bench,
llm_quant, llm_profile, llm_rows): `EngineRow.to_json()` is the row of results.json, its keys in
the order the phases set them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kiln.bench.typed_row import UNSET, JsonRow


@dataclass(frozen=True)
class LogitsParity:
    """kiln's logits against HF's on the prompt, same weights, eager (LlmBench.check_parity): the
    EngineRow fields of the same names, on the unquantized kiln rows."""

    logits_positions: int
    logits_max_abs_err: float
    logits_max_abs_ref: float
    logits_top1_match: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class EngineRow(JsonRow):
    """One engine (at one quantization and batch size), its fields in results.json's order."""

    engine: str
    quant: str
    model: str
    dtype: str
    prompt_len: int
    new_tokens: int
    batch: int
    status: str = "ok"
    reason: str | None = None
    label: str = UNSET
    # The quantized copy a kiln row runs (llm_quant.build_variants; HF rows have none).
    quant_kind: str = UNSET
    quant_backend: str | None = UNSET
    group_size: int | None = UNSET
    quant_lm_head: bool | None = UNSET
    weight_bytes: int = UNSET
    """What one decode step reads of the weights: the copy's, else set with the step figures (`to_json`)."""
    model_bytes: int = UNSET
    # Its quality against the unquantized model (llm_quant.measure_quality, kiln.llm.quality).
    drift_max_abs: float = UNSET
    drift_mean_abs: float = UNSET
    drift_rel_err: float = UNSET
    drift_top1: float = UNSET
    drift_kl: float = UNSET
    drift_positions: int = UNSET
    fidelity_kl: float = UNSET
    fidelity_max_abs: float = UNSET
    fidelity_prompt_kl: float = UNSET
    fidelity_decode_kl: float = UNSET
    fidelity_decode_rows: int = UNSET
    drift_bound: float | None = UNSET
    fidelity_bound: float = UNSET
    drift_judged: str = UNSET
    drift_ok: bool = UNSET
    drift_problem: str | None = UNSET
    ppl: float = UNSET
    ppl_ref: float = UNSET
    ppl_ratio: float = UNSET
    ppl_tokens: int = UNSET
    ppl_bound: float | None = UNSET
    ppl_judged: bool = UNSET
    # Warm-up (LlmBench.warm_up, the engine's compile_stats).
    first_call_s: float = UNSET
    warmup_s: float = UNSET
    compile_s: float | None = UNSET
    graphs: int = UNSET
    graph_breaks: int = UNSET
    recompiles: int | None = UNSET
    compiles: int = UNSET
    decode_attention: str | None = UNSET
    decode_matvec: str | None = UNSET
    compiled_variants: dict[str, Any] | None = UNSET
    graph_cache: dict[str, Any] | None = UNSET  # per variant: graphs from inductor's cache / compiled anew
    matvec_settings: dict[str, list[int]] | None = UNSET
    """kiln.kernels.triton_matvec.tuned_settings after this row's warm-up (`--decode-matvec triton`)."""
    int4_settings: dict[str, list[int]] | None = UNSET
    """kiln.kernels.triton_int4.tuned_settings after this row's warm-up, where int4@triton has run."""
    kv_cache_bytes: int | None = UNSET
    note: str | None = UNSET
    # Prefill alone (LlmBench.time_prefill) and the decode and prefill profiles (llm_profile).
    prefill_error: str = UNSET
    prefill_ms: float = UNSET
    prefill_ms_p90: float = UNSET
    profile: str = UNSET
    profile_verdict: str = UNSET
    profile_ms_per_step: float = UNSET
    profile_kernels_per_step: float | None = UNSET
    profile_idle_frac: float | None = UNSET
    profile_busy_bandwidth_frac: float | None = UNSET
    profile_error: str = UNSET
    prefill_profile: str = UNSET
    prefill_profile_verdict: str = UNSET
    prefill_profile_ms: float = UNSET
    prefill_profile_gpu_busy_ms: float | None = UNSET
    prefill_profile_idle_frac: float | None = UNSET
    prefill_profile_host_ms: float = UNSET
    """Host ops' self time per prefill (the trace's CPU ops; a launch's Python time outside them is not in it)."""
    prefill_profile_error: str = UNSET
    # The figures (llm_rows.finish_rows); parity (logits against HF) on unquantized kiln rows.
    prefill_flops: int | None = UNSET
    kv_bytes_per_step: int = UNSET
    logits_positions: int = UNSET
    logits_max_abs_err: float = UNSET
    logits_max_abs_ref: float = UNSET
    logits_top1_match: float = UNSET
    step_bytes: int = UNSET
    roofline_tok_s: float | None = UNSET
    spec_roofline_tok_s: float | None = UNSET
    prefill_tok_s: float | None = UNSET
    prefill_tflops: float | None = UNSET
    prefill_peak_frac: float | None = UNSET
    prefill_spec_frac: float | None = UNSET
    ttft_ms: float = UNSET
    decode_tok_s: float | None = UNSET
    token_ms_p50: float | None = UNSET
    token_ms_p90: float | None = UNSET
    generate_s: float = UNSET
    request_tok_s: float | None = UNSET
    peak_mem_bytes: int | None = UNSET
    decode_tok_s_per_seq: float | None = UNSET
    achieved_gbs: float = UNSET
    roofline_frac: float | None = UNSET
    roofline_spec_frac: float | None = UNSET
    roofline_copy_frac: float | None = UNSET
    # Against other rows (llm_rows.ratios).
    decode_step_ms: float = UNSET
    decode_vs_unquantized: float | None = UNSET
    vs_hf: str = UNSET
    decode_vs_hf: float | None = UNSET
    prefill_vs_hf: float | None = UNSET
    greedy_ref: str = UNSET
    greedy_match: int = UNSET
    step_vs_batch1: float | None = UNSET
    greedy_match_batch1: int = UNSET
    against_peers: dict[str, Any] = field(default_factory=dict)
    """What a peer sets on this row against its own rows (gpt-fast: `vs_gpt_fast`,
    `request_vs_gpt_fast`), keys of the row after all others: peers run last."""

    def to_json(self) -> dict[str, Any]:
        """The row's keys in order. `weight_bytes` sits with the quantized copy's figures when the
        copy gave it (with `model_bytes`), else (HF rows, a copy that could not be built) just
        before `prefill_flops`, where finish_rows sets it."""
        row = super().to_json()
        peers = row.pop("against_peers")
        if self.model_bytes is UNSET and "weight_bytes" in row:
            weight = row.pop("weight_bytes")
            at = list(row).index("prefill_flops") if "prefill_flops" in row else len(row)
            items = list(row.items())
            row = dict(items[:at] + [("weight_bytes", weight)] + items[at:])
        return {**row, **peers}
