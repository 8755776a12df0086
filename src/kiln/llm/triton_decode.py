"""kiln's own decode-step attention kernel (`--decode-attention triton`), written in Triton.

One decode step attends one query per head over the static cache [B, S, Hkv, D]. The keys are
split into `splits` chunks of consecutive slots; program (b * Hkv + kv head, chunk) loads the G
query heads of its key/value head as one [BLOCK_G, D] tile (G padded to 16 for the tensor cores),
reads its chunk of keys and values once for all G heads, and keeps a running softmax (max, sum,
weighted values) over it. It writes the chunk's normalised output and log-sum-exp; the chunks are
then combined in plain torch (`combine`), which inductor fuses into one small kernel. Chunks past
the step's position, or before a row's first real slot, exit at once and combine with weight 0.

Why: at batch 1 the matmul formulation becomes 5-7 inductor kernels per layer (the softmax over
~1k slots runs on one thread block per head), and FlashAttention's split-KV kernel plus its combine
took ~12 us per layer on an H100 (kiln.llm.decode_attention). Here the chunk count is chosen so
that B * Hkv * splits programs fill the GPU, and the valid range of each row (`start`, `pos`, a
sliding window) is read from device tensors, so shapes never change and the step stays one CUDA
graph. The kernel is registered as the custom op `kiln::decode_attention_chunks`, which
torch.compile calls as an opaque kernel.

Tests run it on CPU through Triton's interpreter (TRITON_INTERPRET=1, fp32); the GPU check is
benchmarks/decode_attention_check.py.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK_S = 64
"""Key slots per inner iteration (and the granularity of a chunk)."""
TARGET_PROGRAMS = 256
"""Programs to aim for per step (~2 per SM on an H100's 132): chunks = this / (B * Hkv)."""


def chunking(batch: int, kv_heads: int, capacity: int) -> tuple[int, int]:
    """(slots per chunk, chunks) for a cache of `capacity` slots: enough chunks that batch * kv_heads
    * chunks programs fill the GPU, each a whole number of BLOCK_S-slot blocks."""
    blocks = -(-capacity // BLOCK_S)
    want = max(1, -(-TARGET_PROGRAMS // (batch * kv_heads)))
    per_chunk = -(-blocks // min(blocks, want)) * BLOCK_S
    return per_chunk, -(-capacity // per_chunk)


def _chunk_attention(Q, K, V, Start, Pos, Out, Lse,
                     stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                     stride_ob, stride_oh, stride_oc, stride_lb, stride_lh,
                     scale, window, kv_heads,
                     G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                     CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    row_head = tl.program_id(0)
    chunk = tl.program_id(1)
    b = row_head // kv_heads
    kv = row_head % kv_heads
    end = tl.load(Pos) + 1  # one past the step's own slot
    first = tl.load(Start + b)
    if window > 0:
        first = tl.maximum(first, end - window)
    lo = tl.maximum(chunk * CHUNK, first)
    hi = tl.minimum(chunk * CHUNK + CHUNK, end)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv * G + g
    g_ok = g < G
    d_ok = d < D
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=g_ok[:, None] & d_ok[None, :],
                other=0.0)
    m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for i in range(0, CHUNK // BLOCK):  # a static trip count; blocks outside [lo, hi) load nothing
        s = chunk * CHUNK + i * BLOCK + tl.arange(0, BLOCK)
        s_ok = (s >= lo) & (s < hi)
        kv_ok = s_ok[:, None] & d_ok[None, :]
        k = tl.load(K + b * stride_kb + s[:, None] * stride_ks + kv * stride_kh + d[None, :], mask=kv_ok, other=0.0)
        scores = tl.dot(q, tl.trans(k)) * scale  # [BLOCK_G, BLOCK] in fp32
        scores = tl.where(s_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a block with no valid slot: weights 0, not NaN
        alpha = tl.exp(m - m_ref)
        p = tl.exp(scores - m_ref[:, None])
        total = total * alpha + tl.sum(p, 1)
        v = tl.load(V + b * stride_vb + s[:, None] * stride_vs + kv * stride_vh + d[None, :], mask=kv_ok, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    has = total > 0
    out = tl.where(has[:, None], acc / tl.where(has, total, 1.0)[:, None], 0.0)
    lse = tl.where(has, m + tl.log(tl.where(has, total, 1.0)), float("-inf"))
    tl.store(Out + b * stride_ob + heads[:, None] * stride_oh + chunk * stride_oc + d[None, :], out,
             mask=g_ok[:, None] & d_ok[None, :])
    tl.store(Lse + b * stride_lb + heads * stride_lh + chunk, lse, mask=g_ok)


_KERNELS: dict[bool, object] = {}


def _kernel():
    """The jitted kernel; Triton picks its interpreter at jit time from TRITON_INTERPRET, so tests
    that set it get an interpreted copy."""
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if interpret not in _KERNELS:
        _KERNELS[interpret] = triton.jit(_chunk_attention)
    return _KERNELS[interpret]


@torch.library.custom_op("kiln::decode_attention_chunks", mutates_args=())
def decode_attention_chunks(q: Tensor, cache_k: Tensor, cache_v: Tensor, start: Tensor, pos: Tensor, scale: float,
                            window: int) -> tuple[Tensor, Tensor]:
    """Per-chunk attention of one decode step. q [B, H, D]; cache_k/v [B, S, Hkv, D] (last dim
    contiguous) with this step's key/value written; start [B]: each row's first real slot; pos
    [1]: the step's slot; window: attend to the last `window` slots only (0: all). Returns the
    normalised output [B, H, chunks, D] and the log-sum-exp [B, H, chunks], both fp32."""
    q, cache_k, cache_v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, cache_k, cache_v))
    B, H, D = q.shape
    S, Hkv = cache_k.shape[1], cache_k.shape[2]
    per_chunk, chunks = chunking(B, Hkv, S)
    out = torch.empty(B, H, chunks, D, dtype=torch.float32, device=q.device)
    lse = torch.empty(B, H, chunks, dtype=torch.float32, device=q.device)
    group = H // Hkv
    _kernel()[(B * Hkv, chunks)](
        q, cache_k, cache_v, start, pos, out, lse,
        q.stride(0), q.stride(1), cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        cache_v.stride(0), cache_v.stride(1), cache_v.stride(2),
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
        scale, window, Hkv,
        G=group, BLOCK_G=max(16, triton.next_power_of_2(group)), D=D, BLOCK_D=triton.next_power_of_2(D),
        CHUNK=per_chunk, BLOCK=BLOCK_S, num_warps=4, num_stages=2)
    return out, lse


@decode_attention_chunks.register_fake
def _(q, cache_k, cache_v, start, pos, scale, window):
    B, H, D = q.shape
    _, chunks = chunking(B, cache_k.shape[2], cache_k.shape[1])
    return q.new_empty(B, H, chunks, D, dtype=torch.float32), q.new_empty(B, H, chunks, dtype=torch.float32)


def combine(out: Tensor, lse: Tensor) -> Tensor:
    """Chunks -> attention output [B, H, D] (fp32): each chunk weighted by its share of the
    softmax mass; empty chunks (lse -inf) weigh 0."""
    weight = torch.exp(lse - lse.amax(dim=-1, keepdim=True))  # [B, H, chunks]
    return (out * weight.unsqueeze(-1)).sum(dim=-2) / weight.sum(dim=-1, keepdim=True)


def triton_decode(q: Tensor, cache_k: Tensor, cache_v: Tensor, start: Tensor, pos: Tensor, scale: float,
                  window: int | None) -> Tensor:
    """One decode step's attention: q [B, 1, H, D] -> [B, 1, H, D] in q's dtype."""
    B, _, H, D = q.shape
    out, lse = torch.ops.kiln.decode_attention_chunks(q.reshape(B, H, D), cache_k, cache_v, start, pos, scale,
                                                      window or 0)
    return combine(out, lse).to(q.dtype).view(B, 1, H, D)
