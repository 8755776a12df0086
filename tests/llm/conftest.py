"""Tiny Hugging Face checkpoints written by transformers itself (save_pretrained, safetensors), one
per supported family, plus a tiny tokenizer: kiln must read what transformers writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

_COMMON = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
           "num_attention_heads": 4, "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2}

# name -> (config class, fields): Llama with Llama-3 RoPE scaling, tied and untied embeddings, GQA;
# Qwen2 (q/k/v biases); Qwen3 (q/k norms, head_dim != hidden/heads); Mistral (sliding window).
FAMILIES = {
    "llama3-tied": ("LlamaConfig", {**_COMMON, "num_key_value_heads": 2, "tie_word_embeddings": True,
                                    "rope_theta": 500000.0,
                                    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 32}}),
    "llama-untied": ("LlamaConfig", {**_COMMON, "num_key_value_heads": 4, "tie_word_embeddings": False,
                                     "attention_bias": True, "mlp_bias": True}),
    "qwen2": ("Qwen2Config", {**_COMMON, "num_key_value_heads": 2, "tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", {**_COMMON, "num_key_value_heads": 1, "head_dim": 16, "tie_word_embeddings": False}),
    "mistral": ("MistralConfig", {**_COMMON, "num_key_value_heads": 2, "sliding_window": 6}),
}


def write_checkpoint(directory: Path, family: str, seed: int = 0) -> Path:
    cls_name, fields = FAMILIES[family]
    config = getattr(transformers, cls_name)(**fields)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    with torch.no_grad():  # norms away from 1 and biases away from 0, so a mix-up shows
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {family: write_checkpoint(root / family, family) for family in FAMILIES}


def write_tokenizer(directory: Path, vocab_size: int = 96) -> Path:
    """A word-level tokenizer.json over a small vocabulary, BOS (id 1) prepended like Llama's."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["<unk>", "<s>", "</s>", *[f"w{i}" for i in range(vocab_size - 3)]]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(directory / "tokenizer.json"))
    return directory / "tokenizer.json"


def assert_decode_matches_matmul(model, kernel: str, tokens: torch.Tensor, pad: torch.Tensor, *, prompt: int = 8,
                                 capacity: int = 20, matvec: str = "inductor", tol: float = 1e-5,
                                 reference=None) -> None:
    """Prefill `tokens[:, :prompt]` (left-padded by `pad`) into one cache per side, then decode the
    rest one step at a time: each step's logits with attention `kernel` and projections `matvec`
    equal those of the matmul attention with plain projections (the plain model, and a copy with
    the kernels swapped in by kiln.llm.kernels.use_decode_kernels). `reference` replaces the plain
    model as the side compared with (a quantized model's dequantized reference: its own layers run
    its kernels, slowly under the interpreter)."""
    import copy

    from kiln.llm.kernels import use_decode_kernels
    from kiln.llm.model import KVCache

    batch = tokens.shape[0]
    models = {"reference": model if reference is None else reference, "candidate": use_decode_kernels(copy.deepcopy(model), attention=kernel, matvec=matvec)}
    caches = {k: KVCache(model.config, batch, capacity, dtype=torch.float32, device="cpu") for k in models}
    with torch.no_grad():
        for k, cache in caches.items():
            models[k](tokens[:, :prompt], cache=cache, pad=pad)
        for t in range(prompt, tokens.shape[1]):
            logits = {k: models[k](tokens[:, t:t + 1], cache=cache, pad=pad, decode_slot=torch.tensor([t]))
                      for k, cache in caches.items()}
            torch.testing.assert_close(logits["candidate"], logits["reference"], rtol=tol, atol=tol)
