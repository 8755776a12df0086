"""What autograd keeps for backward in one micro-batch of kiln's decoder, counted from its shapes: the
activation and loss terms of the GPU memory plan (kiln.train.gpu_memory), per checkpointing mode.

Counted op by op, as eager PyTorch runs kiln.llm.model's Block (N tokens of the micro-batch, d the
width, q = heads x head_dim, kv = kv_heads x head_dim, I the MLP width; r bytes per element of the
residual stream, the model's dtype; c of the matmul outputs, autocast's or the model's):
- an RMSNorm keeps its rsqrt (N x 4), the normalised input before and after the weight
  (N x d x (r + c): the second is the next matmul's input, cast to c under autocast) and the fp32
  input its squares were taken of: two fp32 copies of a 16-bit input (`x.float()` twice), the
  input itself when it is fp32 already;
- attention keeps the q/k/v matmul's output (N x (q + 2 kv) x c: v is a view of it), the rotated
  q and k (N x (q + kv) x c), the kernel's output (N x q x c) and its softmax statistics (fp32 per
  head and query: padded to 32 queries by the memory-efficient kernel); the out-projection's input
  is the kernel's output, its output is only added;
- the MLP keeps the gate/up output (N x 2I x c) and the input of its down projection (N x I x c),
  plus silu(gate) (N x I x c) when the SwiGLU is plain PyTorch (the fused kernel recomputes it).
`selective` (kiln.train.activation_checkpoint) keeps each block's input and the outputs of its
matmuls and attention kernel, `full` the block's input only. Compiled blocks (`compiled`) keep
what AOT autograd's min-cut partitioner, the one inductor uses, leaves for backward: without
checkpointing the block's input, each norm's rsqrt and output, q/k/v, rotated q and k, attention's
output and statistics, the out-projection's output, gate/up and the down projection's input
(nothing in fp32, silu(gate) recomputed); under `selective` all it keeps eagerly but the down
projection's output, which backward never reads; outside the blocks the rotary
cos/sin and the final norm (whose output is the hidden states the loss reads) are kept in every
mode. tests/train/test_activation_bytes.py checks each sum against the tensors a CPU forward
leaves alive. Backward adds, for a checkpointed block, what recomputing it materialises beyond
what is kept, and the gradient of the block's largest tensor (not summed here: a stated model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["none", "selective", "full"]
# SDPA kernels by the softmax statistics they keep (cuDNN's and flash's: one fp32 per head and query).
ATTENTION_STATS_PAD = {"flash": 1, "cudnn": 1, "efficient": 32}


@dataclass(frozen=True)
class DecoderDims:
    """The shapes of kiln's decoder that its saved activations depend on."""

    layers: int
    dim: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab: int


@dataclass(frozen=True)
class Widths:
    """Bytes per element: `residual` of the residual stream (the model's dtype: the gathered dtype
    under FSDP2), `matmul` of the matmul outputs (autocast's dtype, else the model's)."""

    residual: int
    matmul: int


@dataclass(frozen=True)
class Micro:
    """One micro-batch: `batch` sequences of `seq` tokens, the SwiGLU and attention kernels."""

    batch: int
    seq: int
    swiglu: Literal["plain", "fused"] = "plain"
    attention: Literal["flash", "cudnn", "efficient"] = "flash"
    compiled: bool = False
    """The blocks run compiled (torch.compile): what the partitioner keeps, not eager autograd."""

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


def norm_saved(tokens: int, dim: int, w: Widths, out_bytes: int) -> int:
    """An RMSNorm's saved bytes; `out_bytes`: its output's width as it is kept (the next matmul's input)."""
    fp32_inputs = 1 if w.residual >= 4 else 2
    return tokens * 4 + tokens * dim * (w.residual + out_bytes) + fp32_inputs * tokens * dim * 4


def attention_stats(d: DecoderDims, m: Micro) -> int:
    pad = ATTENTION_STATS_PAD[m.attention]
    return m.batch * d.heads * (-(-m.seq // pad) * pad) * 4


def block_saved(d: DecoderDims, w: Widths, m: Micro, mode: Mode) -> int:
    """Bytes one block keeps for backward at the end of the forward, under checkpointing `mode`."""
    n, c = m.tokens, w.matmul
    q, kv, inner = d.heads * d.head_dim, d.kv_heads * d.head_dim, d.ffn_dim
    if mode == "full":
        return n * d.dim * w.residual
    qkv_out, attn_out, gate_up = n * (q + 2 * kv) * c, n * q * c + attention_stats(d, m), n * 2 * inner * c
    if mode == "selective":  # the input, then every matmul's and the attention kernel's output
        down_out = 0 if m.compiled else n * d.dim * c
        return n * d.dim * w.residual + qkv_out + attn_out + n * d.dim * c + gate_up + down_out
    if m.compiled:  # the input, norms' rsqrt and outputs, q/k/v and rotated q/k, attention, wo's output, MLP
        return n * d.dim * w.residual + 2 * (n * 4 + n * d.dim * c) + qkv_out + n * (q + kv) * c + attn_out + \
            n * d.dim * c + gate_up + n * inner * c
    ffn = gate_up + n * inner * c * (1 if m.swiglu == "fused" else 2)
    return 2 * norm_saved(n, d.dim, w, c) + qkv_out + n * (q + kv) * c + attn_out + ffn


def outside_saved(d: DecoderDims, w: Widths, m: Micro) -> int:
    """Kept outside the blocks in every mode: the rotary cos and sin, and the final norm (its output,
    the hidden states, is kept or not by the loss: `loss_saved`)."""
    return 2 * m.tokens * d.head_dim * w.residual + norm_saved(m.tokens, d.dim, w, 0)


def activations_saved(d: DecoderDims, w: Widths, m: Micro, mode: Mode) -> int:
    """What the forward of the micro-batch keeps for backward, up to the final norm (not its output)."""
    return d.layers * block_saved(d, w, m, mode) + outside_saved(d, w, m)


def recompute_bytes(d: DecoderDims, w: Widths, m: Micro, mode: Mode) -> int:
    """Backward's transient on top of what is kept: a checkpointed block's recomputed tensors (what
    `none` keeps minus what the mode kept), and the gradient of the gate/up output (the largest)."""
    extra = 0 if mode == "none" else block_saved(d, w, m, "none") - block_saved(d, w, m, mode) + \
        m.tokens * d.dim * w.residual
    return max(0, extra) + m.tokens * 2 * d.ffn_dim * w.matmul


def loss_saved(d: DecoderDims, w: Widths, tokens: int, kernel: str, autocast: bool) -> int:
    """What the loss keeps for backward: the chunked kernel its gradients of the hidden states and of
    the output weight (in the matmul dtype) and its int64 token count; plain cross-entropy the output
    layer's input (the hidden states, as the matmul reads them), the log-softmax and the loss's
    total weight (both fp32 under autocast, else in the logits' dtype). Under autocast the output
    layer's bf16 weight copy is the plan's `autocast weight copies`."""
    if kernel == "plain":
        softmax = 4 if autocast else w.matmul
        return tokens * d.dim * w.matmul + (tokens * d.vocab + 1) * softmax
    return tokens * d.dim * w.matmul + d.vocab * d.dim * w.matmul + 8


def loss_transient(d: DecoderDims, w: Widths, tokens: int, kernel: str, autocast: bool, chunk: int) -> int:
    """The loss's peak on top of what it keeps: plain's logits (and their fp32 copy under autocast);
    the chunked kernel's logits of one chunk of `chunk` tokens and their gradient, in the matmul
    dtype (on a GPU its fp32 arithmetic runs fused in one compiled kernel)."""
    if kernel == "plain":
        return tokens * d.vocab * (w.matmul + (4 if autocast else 0))
    return 2 * min(tokens, chunk) * d.vocab * w.matmul
