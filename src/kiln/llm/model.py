"""A Llama-family decoder (Llama 3.x, Mistral, Qwen2, Qwen3), single device, readable in one sitting.

Shapes: B batch, T tokens in this call, S cache slots, H query heads, Hkv key/value heads,
G = H // Hkv query heads per key/value head, D head dim.

Choices made for fast decoding (see kiln.llm.engine for the loop around it):
- q/k/v are one matmul (`wqkv`) and the MLP's gate/up another (`w_gate_up`): at batch 1 each
  matmul reads its weights once, and fewer, larger matrix-vector products waste less bandwidth.
  Every projection is a plain `nn.Linear`, so weight-only quantization can swap them later.
- The KV cache is static ([B, S, Hkv, D] per layer, allocated once); a decode step writes its
  slot in place (`index_copy_` at a device tensor) and attends over all S slots under a mask
  computed from that tensor, so shapes never change and nothing recompiles per position.
- Prefill attends within the prompt with SDPA (flash kernels when there is no padding); a
  decode step computes attention as two broadcast matmuls with M = 1 per query head, which
  inductor turns into tuned reductions (`coordinate_descent_tuning`) instead of a kernel that
  parallelises over heads only.
- What every layer's attention reads of one call (RoPE angles, masks, the step's slot, padding)
  is built once per call as `AttentionInputs`, not per layer.
- Prefill computes logits for the last position only (`last_only`).

Nothing here chooses a kernel: kiln's decode kernels (split-KV attention, fused matrix-vector
products) are swapped in from outside by kiln.llm.kernels.use_decode_kernels, which replaces the
implementation of `Attention.decode_attention` / `Attention.core`, `Block.forward` and
`Decoder.logits` for decode steps. Training (`model.name=llama:...`, kiln.models.llama) runs this
same module on full sequences: activation checkpointing, float8, compile, FSDP2 and the fused
cross-entropy (`hidden=True`) are applied to it from outside (kiln.train, kiln.distributed).
Left padding: a batch of prompts of different lengths is padded on the left; `pad[b]` slots of
row b are masked out as keys and its positions start after them, as HF does with attention_mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kiln.llm.decoder_config import DecoderConfig
from kiln.llm.rope import Rotary, apply_rotary


class RMSNorm(nn.Module):
    folded = False
    """True once the weight was folded into the projections that read this norm's output (then all
    ones here; see kiln.llm.quant, int4@triton)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # In fp32, then back to the input dtype before the scale: the order HF's Llama uses.
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class KVCache:
    """Static key/value cache: one [B, S, Hkv, D] tensor each for keys and values per layer (slots
    before heads: a row's keys are one contiguous run, as FlashAttention's varlen layout wants)."""

    def __init__(self, config: DecoderConfig, batch: int, capacity: int, *, dtype: torch.dtype,
                 device: torch.device | str):
        shape = (batch, capacity, config.n_kv_heads, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layers)]
        self.batch, self.capacity = batch, capacity

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))


@dataclass
class AttentionInputs:
    """What every layer's attention reads in one forward call, built once per call by the Decoder."""

    cos: Tensor
    """RoPE cosines [B, T, 1, D] in the model dtype (positions count from each row's first real token)."""
    sin: Tensor
    """RoPE sines, as `cos`."""
    masks: dict[int | None, Tensor | None]
    """Boolean mask (True = may attend) per distinct layer window: [B, S] for a decode step,
    [B, T, T] for a prompt, None where plain causal attention is exact."""
    slot: Tensor | None
    """A decode step: the cache slot it writes and attends up to ([1] long). None: a prompt in
    slots 0..T-1."""
    pad: Tensor | None
    """[B] long: left-padding slots per row (None: no padding)."""
    inv_freq: Tensor
    """RoPE frequencies [D / 2], fp32: for attention kernels that rotate q and k themselves."""

    @property
    def decoding(self) -> bool:
        return self.slot is not None


class Attention(nn.Module):
    expand_kv = False
    """Repeat each key/value head for its query heads before a prompt's SDPA call, for attention
    kernels without grouped-query support (set from outside: kiln.train.attention)."""

    def __init__(self, config: DecoderConfig, window: int | None):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.window = window
        q_out, kv_out = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        self.wqkv = nn.Linear(config.dim, q_out + 2 * kv_out, bias=config.qkv_bias)
        self.wo = nn.Linear(q_out, config.dim, bias=config.out_bias)
        self.q_norm = RMSNorm(config.head_dim, config.norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.norm_eps) if config.qk_norm else None
        self.scale = 1.0 / math.sqrt(config.head_dim)

    def forward(self, x: Tensor, inputs: AttentionInputs, kv: tuple[Tensor, Tensor] | None) -> Tensor:
        return self.wo(self.core(self.wqkv(x), inputs, kv))

    def core(self, qkv: Tensor, inputs: AttentionInputs, kv: tuple[Tensor, Tensor] | None) -> Tensor:
        """Attention from the projected q/k/v [B, T, (H + 2 Hkv) D] to [B, T, H D], before `wo`.
        `kv`: this layer's cache (keys, values), written here; None: no cache (training)."""
        B, T, _ = qkv.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        q, k, v = q.view(B, T, H, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, inputs.cos, inputs.sin), apply_rotary(k, inputs.cos, inputs.sin)  # [B, T, heads, D]
        if inputs.decoding:
            cache_k, cache_v = kv
            cache_k.index_copy_(1, inputs.slot, k)
            cache_v.index_copy_(1, inputs.slot, v)
            y = self.decode_attention(q, cache_k, cache_v, inputs)
        else:
            if kv is not None:  # a fresh prompt fills slots 0..T-1
                kv[0][:, :T] = k
                kv[1][:, :T] = v
            y = self._prompt_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       inputs.masks[self.window])
        return y.transpose(1, 2).reshape(B, T, H * D)

    def decode_attention(self, q: Tensor, cache_k: Tensor, cache_v: Tensor, inputs: AttentionInputs) -> Tensor:
        """One decode step's attention: q [B, 1, H, D] over the cache [B, S, Hkv, D] (this step's
        key/value already written) -> [B, H, 1, D]."""
        return self._decode_attention(q.transpose(1, 2), cache_k.transpose(1, 2), cache_v.transpose(1, 2),
                                      inputs.masks[self.window])

    def _prompt_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        groups = self.n_heads // self.n_kv_heads
        if mask is None and not self.expand_kv:  # plain causal: flash attention handles GQA itself
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=groups > 1)
        # With a padding/window mask flash is out; expand k/v for the kernels that take a mask.
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])

    def _decode_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        # q [B, H, 1, D] -> [B, Hkv, G, 1, D]; k, v [B, Hkv, S, D] -> [B, Hkv, 1, S, D]. Every query
        # head is a matrix-vector product against its group's cache (no copy of k/v when compiled).
        B, H, _, D = q.shape
        q = q.reshape(B, self.n_kv_heads, H // self.n_kv_heads, 1, D)
        scores = (q @ k.unsqueeze(2).transpose(-1, -2)).float() * self.scale  # [B, Hkv, G, 1, S]
        scores = scores.masked_fill(~mask[:, None, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        return (probs @ v.unsqueeze(2)).reshape(B, H, 1, D)


class FeedForward(nn.Module):
    """SwiGLU: w_down(silu(gate) * up), with gate and up in one matmul."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.w_gate_up = nn.Linear(config.dim, 2 * config.ffn_dim, bias=config.mlp_bias)
        self.w_down = nn.Linear(config.ffn_dim, config.dim, bias=config.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w_gate_up(x).chunk(2, dim=-1)
        return self.w_down(F.silu(gate) * up)


class Block(nn.Module):
    norm_class: type[nn.Module] = RMSNorm
    """The block's norms, built as `norm_class(dim, eps)`: a family with another norm subclasses Block."""
    ffn_class: type[nn.Module] = FeedForward
    """The block's MLP, built as `ffn_class(config)`: a family with another MLP subclasses Block."""

    def __init__(self, config: DecoderConfig, window: int | None):
        super().__init__()
        self.attn_norm = self.norm_class(config.dim, config.norm_eps)
        self.attn = Attention(config, window)
        self.ffn_norm = self.norm_class(config.dim, config.norm_eps)
        self.ffn = self.ffn_class(config)

    def forward(self, x: Tensor, inputs: AttentionInputs, kv: tuple[Tensor, Tensor] | None) -> Tensor:
        x = x + self.attn(self.attn_norm(x), inputs, kv)
        return x + self.ffn(self.ffn_norm(x))


class Decoder(nn.Module):
    block_class: type[Block] = Block
    """The layers' class: a family whose blocks differ (another MLP or norm) subclasses Decoder and Block."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(self.block_class(config, config.layer_window(i)) for i in range(config.n_layers))
        self.norm = self.block_class.norm_class(config.dim, config.norm_eps)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.rotary = Rotary(config.rope, config.head_dim)

    def forward(self, tokens: Tensor, *, cache: KVCache | None = None, pad: Tensor | None = None,
                decode_slot: Tensor | None = None, last_only: bool = False, hidden: bool = False) -> Tensor:
        """Logits [B, T or 1, vocab] for `tokens` [B, T] (with `hidden`: the final normed hidden
        states [B, T, dim] instead, for a loss that applies `lm_head` itself, e.g. a fused linear +
        cross-entropy that never holds all the logits).

        Without `decode_slot`: a fresh sequence in slots 0..T-1 (written to `cache` if given),
        causal attention within it. With `decode_slot` (a one-element long tensor): one decode
        step, T == 1, writing that slot and attending over the whole cache up to it.
        `pad` [B]: left-padding slots per row (masked out; positions count from the first real
        token). `last_only`: logits of the last position only (all prefill needs).
        """
        x = self.embed(tokens)
        inputs = self.attention_inputs(tokens, cache, pad, decode_slot, x.dtype)
        for i, layer in enumerate(self.layers):
            kv = (cache.k[i], cache.v[i]) if cache is not None else None
            x = layer(x, inputs, kv)
        if last_only:
            x = x[:, -1:]
        if hidden:
            return self.norm(x)
        return self.logits(x, inputs)

    def logits(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """The final norm and the vocabulary projection of the hidden states x [B, T, dim]."""
        return self.lm_head(self.norm(x))

    def attention_inputs(self, tokens: Tensor, cache: KVCache | None, pad: Tensor | None,
                         decode_slot: Tensor | None, dtype: torch.dtype) -> AttentionInputs:
        """RoPE angles, masks, slot and padding of this call, for every layer."""
        B, T = tokens.shape
        slots = decode_slot if decode_slot is not None else torch.arange(T, device=tokens.device)
        positions = slots.view(1, T).expand(B, T)
        if pad is not None:
            positions = (positions - pad.view(B, 1)).clamp(min=0)
        cos, sin = self.rotary(positions, dtype)
        masks = self._masks(T, slots, pad, cache, decode=decode_slot is not None)
        return AttentionInputs(cos, sin, masks, decode_slot, pad, self.rotary.inv_freq)

    def _masks(self, T: int, slots: Tensor, pad: Tensor | None, cache: KVCache | None, *,
               decode: bool) -> dict[int | None, Tensor | None]:
        """Boolean masks (True = may attend) per distinct layer window: [B, S] for a decode step,
        [B, T, T] for a prompt, or None where plain causal attention is exact (no padding, no
        window shorter than the prompt)."""
        windows = {layer.attn.window for layer in self.layers}
        if not decode and pad is None and all(w is None or w >= T for w in windows):
            return dict.fromkeys(windows)
        device = slots.device
        if decode:
            keys = torch.arange(cache.capacity, device=device).view(1, -1)  # [1, S]
            query = slots.view(1, 1)
            base = keys <= query
        else:
            keys = torch.arange(T, device=device).view(1, 1, T)  # [1, 1, T]
            query = torch.arange(T, device=device).view(1, T, 1)
            base = keys <= query
        if pad is not None:
            pad = pad.view(-1, *([1] * (keys.dim() - 1)))
            # A padding query may see itself: a row with nothing to attend to would give NaN,
            # which its (masked, but multiplied by zero) cache slot would then spread.
            base = base & ((keys >= pad) | (keys == query))
        return {w: base if w is None else base & (keys > query - w) for w in windows}
