"""The attention kernel behind `scaled_dot_product_attention` while training (`model.attention`).

`auto` lets torch choose per call (flash attention where it applies, then cuDNN, memory-efficient,
math); the others restrict SDPA to one kernel for the run (torch.nn.attention.sdpa_kernel around
the training loop, where compile also reads it). Which kernel runs for the model's attention
shapes is found by asking SDPA's own dispatcher (`torch._fused_sdp_choice`) on a tensor of those
shapes, and reported. A kernel without grouped-query support runs with the key/value heads
repeated for their query heads (kiln's decoder `Attention.expand_kv`); a kernel that cannot run
the shapes at all is refused before training.
"""

from __future__ import annotations

import contextlib
from typing import get_args

import torch

from kiln.config.schema import Attention
from kiln.errors import ConfigError

CHOICES = get_args(Attention)
_NAMES = {"FLASH_ATTENTION": "flash", "CUDNN_ATTENTION": "cudnn", "EFFICIENT_ATTENTION": "efficient",
          "MATH": "math", "OVERRIDEABLE": "overrideable"}


def _backend(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]


def attention_backend(name: str) -> contextlib.AbstractContextManager:
    """A context in which SDPA uses only kernel `name` (`auto`: no restriction)."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel([_backend(name)])


def _attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """kiln decoder attention modules (they carry the head counts and `expand_kv`)."""
    return [m for m in model.modules() if hasattr(m, "expand_kv") and hasattr(m, "n_kv_heads")]


def _choice(q, k, v, gqa: bool) -> str:
    from torch.nn.attention import SDPBackend

    picked = torch._fused_sdp_choice(q, k, v, None, 0.0, True, enable_gqa=gqa)
    return _NAMES.get(SDPBackend(picked).name, SDPBackend(picked).name.lower())


def choose_attention(model: torch.nn.Module, name: str, *, device: torch.device, dtype: torch.dtype,
                     seq_len: int) -> dict:
    """Which SDPA kernel trains `model` under `model.attention=name`, probed for its shapes (causal,
    `seq_len` tokens, `dtype`, on `device`); sets `expand_kv` on its attention modules where the
    kernel needs it. Returns {"requested", "kernel", "expand_kv"} for the log and summary.json
    ("kernel" None when the model has no kiln attention modules to probe)."""
    if name not in CHOICES:
        raise ConfigError("model.attention", f"unknown value {name!r}", CHOICES)
    modules = _attention_modules(model)
    if not modules:
        return {"requested": name, "kernel": None, "expand_kv": False}
    first = modules[0]
    heads, kv_heads, head_dim = first.n_heads, first.n_kv_heads, first.head_dim
    gqa = heads != kv_heads
    q = torch.empty(1, heads, seq_len, head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.empty(1, kv_heads, seq_len, head_dim, device=device, dtype=dtype, requires_grad=True)
    expanded = torch.empty(1, heads, seq_len, head_dim, device=device, dtype=dtype, requires_grad=True)
    expand = False
    with attention_backend(name):
        try:
            kernel = _choice(q, k, k, gqa)
        except RuntimeError as grouped_error:
            try:  # the kernel may lack grouped-query support: try it with the heads repeated
                kernel = _choice(q, expanded, expanded, False)
                expand = gqa
            except RuntimeError:
                raise ConfigError("model.attention", f"the {name!r} attention kernel cannot run this model's "
                                  f"attention ({heads} heads of {head_dim}, {seq_len} tokens, {dtype}) on "
                                  f"{device}: {str(grouped_error).splitlines()[0][:200]}", CHOICES) from None
    for module in modules:
        module.expand_kv = expand
    return {"requested": name, "kernel": kernel, "expand_kv": expand}
