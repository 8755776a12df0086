"""Shapes of public Llama-family models, as the `config.json` fields their checkpoints ship.

Configs only: a preset builds a model with random weights (for benchmarks and smoke runs) and
never downloads anything. Field names are those of transformers 4.x (`rope_theta`,
`rope_scaling`), which transformers 5 still accepts and kiln.llm.llama_family reads either way, so
the same table serves kiln's own decoder and `hf:<preset>` models for `kiln train`.
"""

from __future__ import annotations

from typing import Any

_LLAMA3_COMMON: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "attention_bias": False,
    "mlp_bias": False,
    "initializer_range": 0.02,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "torch_dtype": "bfloat16",
}


def _llama3_scaling(factor: float) -> dict[str, Any]:
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


PRESETS: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-3.2-1B config.json (1,235,814,400 parameters, embeddings tied).
    "llama-3.2-1b": {
        **_LLAMA3_COMMON,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "rope_scaling": _llama3_scaling(32.0),
        "tie_word_embeddings": True,
    },
    # meta-llama/Llama-3.2-3B config.json (3,212,749,824 parameters, embeddings tied).
    "llama-3.2-3b": {
        **_LLAMA3_COMMON,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rope_scaling": _llama3_scaling(32.0),
        "tie_word_embeddings": True,
    },
    # meta-llama/Llama-3.1-8B config.json (8,030,261,248 parameters, separate output head).
    "llama-3.1-8b": {
        **_LLAMA3_COMMON,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rope_scaling": _llama3_scaling(8.0),
        "tie_word_embeddings": False,
    },
    # A tiny Llama for tests and smoke runs: builds and trains a step in milliseconds on CPU.
    "llama-tiny": {
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}
