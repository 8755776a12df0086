"""Host memory `kiln bench llm` needs on a CPU, estimated from the model's config before any model
is built, and the refusal (exit 2, in seconds) of a bench the host cannot hold.

A bench builds several models at once: the transformers model for the `hf-*` rows, kiln's decoder
(a copy of the same weights) for the `kiln-*` rows, and a quantized copy per `--quant` entry.
On top of them each engine keeps a KV cache of batch x (prompt + new tokens) per batch size, and a prefill holds
the prompt's fp32 logits. On a GPU these live in device memory (the GPU reports its own OOM);
on a CPU they are all host memory, and a 3B model in fp32 twice over is killed by the kernel.
"""

from __future__ import annotations

import os

import torch

from kiln.bench.llm.llm_engines import HF_ENGINES
from kiln.bench.llm.llm_options import LlmBenchPlan
from kiln.errors import ConfigError
from kiln.llm.config import resolve_model
from kiln.llm.weights import TORCH_DTYPES
from kiln.models.host_memory import decoder_params, gib, host_memory

SKIP_ENV = "KILN_SKIP_MEMORY_CHECK"
# Bits per weight a quantized copy keeps (int4 with its group scales; int8), by kind.
QUANT_BITS = {"int4": 4.5, "nf4": 4.5, "int8": 8.5}


def bench_host_bytes(plan: LlmBenchPlan) -> dict[str, int]:
    """What the bench holds in host memory on a CPU, by part (bytes)."""
    config = resolve_model(plan.model).config
    width = torch.finfo(TORCH_DTYPES[plan.dtype]).bits // 8
    weights = decoder_params(config) * width
    parts: dict[str, int] = {}
    if any(e in HF_ENGINES for e in plan.engines):
        parts["transformers model"] = weights
    if any(e.startswith("kiln") for e in plan.engines) or plan.gpt_fast:
        parts["kiln model"] = weights
    for name, spec in plan.quants.items():
        if spec.kind != "none":
            parts[f"{name} copy"] = int(weights / width * QUANT_BITS.get(spec.kind, 8.5) / 8)
    # Every engine keeps a cache per batch size it runs (its rows are built one after the other, and kept).
    tokens = sum(plan.batches) * (plan.prompt_len + plan.new_tokens)
    cache = tokens * config.n_layers * 2 * config.n_kv_heads * config.head_dim * width
    parts[f"KV caches ({len(plan.engines)} engines)"] = cache * len(plan.engines)
    parts["prefill logits"] = max(plan.batches) * plan.prompt_len * config.vocab_size * 4
    return parts


def check_bench_fits(plan: LlmBenchPlan) -> None:
    """ConfigError (exit 2) when a CPU bench needs more host memory than is available, naming the
    parts and what would fit: fewer engines (one model), bf16, or a smaller model."""
    if torch.device(plan.device).type != "cpu" or os.environ.get(SKIP_ENV) == "1":
        return
    total, available = host_memory()
    if available is None:
        return
    parts = bench_host_bytes(plan)
    need = sum(parts.values())
    if need <= available:
        return
    fixes = []
    models = [k for k in parts if k.endswith("model")]
    if len(models) > 1 and need - parts["transformers model"] <= available:
        fixes.append("--engines kiln-eager,kiln-compiled (one model, not two)")
    if plan.dtype == "fp32" and need / 2 <= available:
        fixes.append("--dtype bf16 (half the bytes)")
    if not fixes:
        fixes.append("a smaller --model, --batch or --prompt-len, or a GPU (the presets are sized for one)")
    shown = ", ".join(f"{k} {gib(v)}" for k, v in parts.items())
    raise ConfigError("--model", f"this bench needs about {gib(need)} of host memory on this CPU ({shown}); this host "
                      f"has {gib(available)} available of {gib(total)}: {'; or '.join(fixes)} "
                      f"({SKIP_ENV}=1 tries anyway)")
