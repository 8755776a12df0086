"""Decode-step attention kernels (`auto`, the default, is `triton` where it runs, else `matmul`;
`flash`), where each can run, and FlashAttention-2's varlen call for `flash`.

A batch-1 decode step attends one query per head over the static cache. Written as two broadcast
matmuls (`matmul`, kiln.llm.model), inductor turns it into several small kernels per layer whose
launches cost more than reading the keys and values. A split-KV kernel instead gives each thread
block a chunk of the cache for all query heads of a group, which fills the GPU at batch 1.

`flash` calls FlashAttention-2's variable-length forward (torch's `_flash_attention_forward`, the
kernel behind SDPA's flash backend) on the cache as it is: row b's keys start at slot `pad[b]`
(`cu_seqlens_k[b] = b * S + pad[b]`) and it uses `pos + 1 - pad[b]` of them (`seqused_k`), so
neither a mask nor a copy of the cache is needed and shapes stay static for CUDA graphs.

`triton` is kiln's own split-KV kernel (kiln.kernels.triton_decode): the same idea with the chunk
count sized to fill the GPU, sliding windows handled in the kernel, and the chunks combined in
the same launch by the last one to finish.

`flash` and `triton` need CUDA and fp16/bf16; `flash` also a head dim that is a multiple of 8 up
to 256, no sliding window on the layer (Mistral's windowed layers keep `matmul`), and a torch
whose op takes `seqused_k`; `triton` needs Triton (it ships with CUDA builds of torch). The
kernels are swapped into a model by kiln.llm.kernels.use_decode_kernels; this module chooses.
The measurements behind the choice are in the results READMEs (docs/benchmarks.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kiln.errors import ConfigError

KERNELS = ("auto", "matmul", "flash", "triton")
"""`auto` (the default): `triton` where it can run (the fastest of the three where measured),
else `matmul`."""


def flash_unavailable(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why `flash` cannot run here, or None when it can."""
    if device.type != "cuda":
        return f"needs a CUDA device (the model is on {device})"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"needs fp16 or bf16 (the model is {str(dtype).replace('torch.', '')})"
    if head_dim % 8 or head_dim > 256:
        return f"needs a head dim that is a multiple of 8 up to 256 (this model's is {head_dim})"
    op = getattr(torch.ops.aten, "_flash_attention_forward", None)
    if op is None or "seqused_k" not in str(op.default._schema):
        return f"torch {torch.__version__} has no flash forward with seqused_k"
    major, _ = torch.cuda.get_device_capability(device)
    if major < 8:
        return "FlashAttention-2 needs compute capability 8.0 or newer"
    return None


def triton_unavailable(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why `triton` cannot run here, or None when it can."""
    if device.type != "cuda":
        return f"needs a CUDA device (the model is on {device})"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"needs fp16 or bf16 (the model is {str(dtype).replace('torch.', '')})"
    if head_dim > 256:
        return f"needs a head dim up to 256 (this model's is {head_dim})"
    try:
        import kiln.kernels.triton_decode  # noqa: F401  (registers the kernel's op)
    except ImportError as exc:
        return f"needs Triton, which does not import here ({exc})"
    major, _ = torch.cuda.get_device_capability(device)
    if major < 8:
        return "needs compute capability 8.0 or newer"
    return None


UNAVAILABLE = {"flash": flash_unavailable, "triton": triton_unavailable}


def check(choice: str, device: torch.device, dtype: torch.dtype, head_dim: int, *,
          key: str = "decode_attention") -> str:
    """The kernel `choice` runs as here (`auto` resolved); an unknown kernel, or `flash`/`triton`
    where it cannot run, is a ConfigError naming `key`."""
    if choice not in KERNELS:
        raise ConfigError(key, f"unknown decode attention kernel {choice!r}", KERNELS)
    if choice == "auto":
        return "triton" if triton_unavailable(device, dtype, head_dim) is None else "matmul"
    reason = UNAVAILABLE[choice](device, dtype, head_dim) if choice in UNAVAILABLE else None
    if reason is not None:
        raise ConfigError(key, f"{choice} {reason}", KERNELS)
    return choice


def varlen_rows(batch: int, capacity: int, slot: Tensor, pad: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Where each row's keys are for the varlen kernel, computed once per decode step: (cu_q,
    cu_k, used_k), int32. Row b starts at slot pad[b] of its [capacity] run and uses
    slot + 1 - pad[b] keys."""
    rows = torch.arange(batch + 1, device=slot.device, dtype=torch.int32)
    start = rows * capacity
    used = (slot + 1).to(torch.int32).expand(batch)
    if pad is not None:
        pad32 = pad.to(torch.int32)
        start = start + torch.cat([pad32, pad32.new_zeros(1)])
        used = used - pad32
    return rows, start, used.contiguous()


def flash_decode(q: Tensor, cache_k: Tensor, cache_v: Tensor, rows: tuple[Tensor, Tensor, Tensor],
                 scale: float) -> Tensor:
    """One decode step's attention. q [B, 1, H, D]; cache_k/v [B, S, Hkv, D] with this step's
    key/value already written; `rows` from `varlen_rows`. Returns [B, 1, H, D]."""
    B, _, H, D = q.shape
    S, Hkv = cache_k.shape[1], cache_k.shape[2]
    cu_q, cu_k, used = rows
    out = varlen_forward(q.reshape(B, H, D), cache_k.view(B * S, Hkv, D), cache_v.view(B * S, Hkv, D), cu_q, cu_k,
                         used, S, scale)
    return out.view(B, 1, H, D)


def varlen_forward(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, used_k: Tensor, max_k: int,
                   scale: float) -> Tensor:
    """FlashAttention-2's varlen forward, one query per row: q [B, H, D]; k, v [total, Hkv, D]; row b
    attends to keys cu_k[b] .. cu_k[b] + used_k[b] - 1. Returns [B, H, D]."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, 1, max_k, 0.0, False, False, scale=scale,
                                                   seqused_k=used_k)[0]
