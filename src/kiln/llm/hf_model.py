"""transformers' own model for a kiln ModelSource: the reference kiln's decoder is compared and
benchmarked against (same config, same weights). transformers is imported only here, lazily."""

from __future__ import annotations

import torch

from kiln.llm.hf_config import dtype_kwarg, import_transformers, make_config
from kiln.llm.weights import has_weights


def build_hf_model(source, *, device: torch.device, dtype: torch.dtype, seed: int):
    """The HF model of `source` (its weights when its directory has them, else random, seeded)."""
    transformers = import_transformers(source.spec)
    config = make_config(source.raw, {}, source.spec)
    kwargs = {"attn_implementation": "sdpa", **dtype_kwarg(transformers, dtype)}
    if has_weights(source.directory):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(source.directory), config=config,
                                                                  local_files_only=True, use_safetensors=True,
                                                                  **kwargs).to(device)
    else:
        torch.manual_seed(seed)
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(config, **kwargs)
    model.eval().requires_grad_(False)
    # Benchmark requests run to their length: no EOS stop from the model's own defaults.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def hf_available() -> str | None:
    """None when transformers imports, else the reason HF rows are skipped."""
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        return f"transformers is not installed ({exc}); pip install 'kiln[llm]'"
    return None
