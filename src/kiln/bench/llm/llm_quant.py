"""The quantized side of `kiln bench llm`: one quantized copy of kiln's model per `--quant` kind, and
its quality against the unquantized model (kiln.llm.quality): logit drift on a fixed prompt set,
perplexity on `--ppl-file`, and the drift bound that marks a row `accuracy_fail`.

Every quantized copy shares the unquantized model's embedding and norms (kiln.llm.quant), so the
bench holds them all at once and each kiln engine row picks its model by quant kind. HF rows stay
in the model dtype: they are the reference recipe, not a quantization target.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from kiln.bench.llm.llm_engine_row import EngineRow
from kiln.bench.row_failure import failure
from kiln.bench.typed_row import JsonRow
from kiln.data.eval_tokens import read_ppl_tokens
from kiln.kernels.triton_matvec import MAX_ROWS
from kiln.llm.quality import (
    DRIFT_BOUNDS,
    FIDELITY_BOUND,
    drift_prompts,
    judge_ppl,
    judge_quantized,
    kernel_fidelity,
    logit_drift,
    perplexity,
)
from kiln.llm.quant import QuantSpec, bitsandbytes_missing, dequantized_reference, quantize_decoder
from kiln.llm.tokenizer import find_tokenizer, load_tokenizer
from kiln.llm.weights import count_bytes, decode_weight_bytes

Log = Callable[[str], None]


def _quant_figures() -> type[JsonRow]:
    """QuantFigures: EngineRow's fields from `quant_kind` through `ppl_judged` (their one definition),
    as a frozen row of their own."""
    names = [f.name for f in dataclasses.fields(EngineRow)]
    section = dataclasses.fields(EngineRow)[names.index("quant_kind"):names.index("ppl_judged") + 1]
    return dataclasses.make_dataclass("QuantFigures", [(f.name, f.type, dataclasses.field(default=f.default))
                                                       for f in section],
                                      bases=(JsonRow,), frozen=True)


QuantFigures = _quant_figures()
"""A quantized copy's figures, set on each of its kiln rows (llm_bench, `row.update(**figures.to_json())`):
the kiln.bench.llm.llm_engine_row EngineRow fields of the quantized copy and its quality, in its
order; a figure not measured stays UNSET and is not written."""


@dataclass
class QuantVariant:
    spec: QuantSpec
    model: Any = None
    status: str = "ok"
    reason: str | None = None
    figures: QuantFigures | None = None
    """Row figures: backend, group size, bytes, drift, perplexity (set by build_variants)."""


def load_ppl_tokens(path: str | None, source, vocab_size: int) -> list[int] | None:
    """The perplexity text as token ids (the model directory's tokenizer for text), or None."""
    if not path:
        return None

    tokenizer = load_tokenizer(source.directory, "--ppl-file") if find_tokenizer(source.directory) else None
    return read_ppl_tokens(path, tokenizer, vocab_size)


def build_variants(base, specs: dict[str, QuantSpec], log: Log) -> dict[str, QuantVariant]:
    """entry (`int4`, `int4@inductor`, ...) -> its model (the base model itself for `none`), or the
    reason it could not be built."""
    variants: dict[str, QuantVariant] = {}
    for entry, spec in specs.items():
        v = variants[entry] = QuantVariant(spec)
        if spec.kind == "none":
            v.model = base
        elif spec.kind == "nf4" and (missing := bitsandbytes_missing()):
            v.status, v.reason = "skipped", missing
        else:
            log(f"quantizing kiln's decoder: {spec.describe()}")
            try:
                v.model = quantize_decoder(base, spec)
            except Exception as exc:
                v.status, v.reason = failure(exc)
                log(f"quantizing {entry} failed: {v.reason}")
        quantized = spec.kind != "none"
        v.figures = QuantFigures(quant_kind=spec.kind, quant_backend=spec.library,
                                 group_size=spec.group if quantized else None,
                                 quant_lm_head=spec.lm_head if quantized else None)
        if v.model is not None:
            v.figures = replace(v.figures, weight_bytes=decode_weight_bytes(v.model), model_bytes=count_bytes(v.model))
    return variants


def measure_quality(variants: dict[str, QuantVariant], base, *, ppl_tokens: list[int] | None, ppl_context: int,
                    ppl_max_tokens: int | None, real_weights: bool, log: Log) -> dict[str, Any]:
    """Drift of every quantized variant against `base` and perplexity of each (base included), into
    the variants' figures; returns the run-level context (prompt set, perplexity text size)."""
    config = base.config
    prompts = drift_prompts(config.vocab_size, config.max_positions, ppl_tokens)
    context = min(ppl_context, config.max_positions)
    ppl_ref = None
    if ppl_tokens is not None:
        log(f"perplexity of the unquantized model on {min(len(ppl_tokens), ppl_max_tokens or len(ppl_tokens))} tokens")
        ppl_ref = perplexity(base, ppl_tokens, context=context, max_tokens=ppl_max_tokens)
    for entry, v in variants.items():
        if v.model is None:
            continue
        try:
            if v.spec.kind != "none":
                drift = logit_drift(v.model, base, prompts)
                reference = dequantized_reference(base, v.model, v.spec)
                fidelity = kernel_fidelity(v.model, reference, prompts, MAX_ROWS)
                del reference
                problem = judge_quantized(v.spec.kind, drift, fidelity["fidelity_kl"], real_weights=real_weights)
                v.figures = replace(v.figures, **drift, **fidelity, drift_bound=DRIFT_BOUNDS.get(v.spec.kind),
                                    fidelity_bound=FIDELITY_BOUND,
                                    drift_judged="quality and kernel fidelity" if real_weights else
                                    "kernel fidelity (random weights: quality not judged)",
                                    drift_ok=problem is None, drift_problem=problem)
                log(f"{entry}: drift KL {drift['drift_kl']:.3g} nats/token (bound {DRIFT_BOUNDS.get(v.spec.kind)}"
                    f"{'' if real_weights else ', not judged: random weights'}), top-1 agreement "
                    f"{100 * drift['drift_top1']:.1f}%; kernel fidelity KL {fidelity['fidelity_kl']:.3g} "
                    f"(bound {FIDELITY_BOUND})")
            if ppl_ref is not None:
                ppl = ppl_ref if v.spec.kind == "none" else perplexity(v.model, ppl_tokens, context=context,
                                                                 max_tokens=ppl_max_tokens)
                ratio = ppl["ppl"] / ppl_ref["ppl"]
                v.figures = replace(v.figures, ppl=ppl["ppl"], ppl_ref=ppl_ref["ppl"], ppl_ratio=ratio,
                                    ppl_tokens=ppl["ppl_tokens"])
                if v.spec.kind != "none":
                    bound, problem = judge_ppl(v.spec.kind, ratio)
                    v.figures = replace(v.figures, ppl_bound=bound, ppl_judged=real_weights)
                    if real_weights and problem is not None and v.figures.get("drift_ok") is not False:
                        v.figures = replace(v.figures, drift_ok=False, drift_problem=problem)
                    log(f"{entry}: perplexity {ppl['ppl']:.3f} ({100 * (ratio - 1):+.2f}% against unquantized; "
                        f"bound {bound}{'' if real_weights else ', not judged: random weights'})")
        except Exception as exc:
            v.status, v.reason = failure(exc)
            v.model = None
            log(f"{entry}: quality check failed: {v.reason}")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {"drift_prompts": list(prompts.shape), "real_weights": real_weights,
            "drift_from_ppl_text": ppl_tokens is not None
            and len(ppl_tokens) >= prompts.numel(), "ppl_context": context if ppl_tokens is not None else None}


def mark_drift(row: EngineRow) -> None:
    """A row over its drift bounds becomes `accuracy_fail`, keeping every figure."""
    if row.status == "ok" and row.get("drift_ok") is False:
        row.status = "accuracy_fail"
        row.reason = f"{row.drift_problem} (kiln.llm.quality)"
