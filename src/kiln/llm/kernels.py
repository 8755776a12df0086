"""kiln's decode kernels swapped into a plain Decoder from outside: `use_decode_kernels`.

kiln.llm.model stays a plain single-device decoder; this module gives an existing model's decode
steps kiln's kernels the way torch's `fully_shard` applies FSDP2: each module's class is swapped
for a subclass that overrides one method for decode steps, so parameters, buffers, state-dict
keys and hooks stay where they are, prompts (prefill, training) run the plain code, and calling
it again with other choices (`matmul` / `inductor` back to plain) swaps them back. The swap
(kiln.llm.swap) keeps a family's own subclasses of Decoder, Block and Attention; the family's spec
says which of these kernels its modules take (`decode_attention`, `decode_matvec`).

Attention (`attention`, chosen and checked by kiln.llm.decode_attention):
- `flash`: FlashAttention-2's varlen forward on the cache as it is (`flash_decode`), on layers
  without a sliding window (windowed layers keep `matmul`);
- `triton`: kiln's split-KV kernel (kiln.kernels.triton_decode); on layers without q/k norms it
  also applies RoPE and writes the step's cache slot (op `kiln::decode_attention_rope`), from the
  projection's output, in one launch.
Projections (`matvec`, chosen and checked by kiln.llm.decode_matvec):
- `triton`: each layer's projections run through kiln's matrix-vector kernel with the RMSNorms,
  the SwiGLU and the residual adds fused in (`fused_linear`, `fused_mlp`), and so do the final
  norm and lm_head.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kiln.llm.decode_attention import KERNELS, flash_decode, varlen_rows
from kiln.llm.decode_matvec import CHOICES, fused_linear, fused_mlp, kernel_writes
from kiln.llm.families import takes_kernel
from kiln.llm.model import Attention, AttentionInputs, Block, Decoder
from kiln.llm.swap import swap_class, wrapped


class FlashDecodeAttention(Attention):
    """A decode step's attention by FlashAttention-2's varlen kernel (kiln.llm.decode_attention)."""

    _plain_class = Attention

    def decode_attention(self, q: Tensor, cache_k: Tensor, cache_v: Tensor, inputs: AttentionInputs) -> Tensor:
        rows = varlen_rows(q.shape[0], cache_k.shape[1], inputs.slot, inputs.pad)
        return flash_decode(q, cache_k, cache_v, rows, self.scale).transpose(1, 2)


class TritonDecodeAttention(Attention):
    """A decode step's attention by kiln's split-KV kernel (kiln.kernels.triton_decode), after the
    model's own q/k norms, RoPE and cache write."""

    _plain_class = Attention

    def decode_attention(self, q: Tensor, cache_k: Tensor, cache_v: Tensor, inputs: AttentionInputs) -> Tensor:
        import kiln.kernels.triton_decode  # noqa: F401  (registers kiln::decode_attention; Triton is optional)

        B, _, H, D = q.shape  # one token per row
        y = torch.ops.kiln.decode_attention(q.reshape(B, H, D), cache_k, cache_v, inputs.pad, inputs.slot, self.scale,
                                            self.window or 0)
        return y.view(B, 1, H, D).transpose(1, 2)


class TritonRopeDecodeAttention(Attention):
    """A decode step's RoPE, cache write and attention in one launch of kiln's kernel
    (kiln.kernels.triton_decode), for layers without q/k norms."""

    _plain_class = Attention

    def core(self, qkv: Tensor, inputs: AttentionInputs, kv: tuple[Tensor, Tensor] | None) -> Tensor:
        if not inputs.decoding:
            return super().core(qkv, inputs, kv)
        import kiln.kernels.triton_decode  # noqa: F401  (registers kiln::decode_attention_rope; Triton is optional)

        B, T, _ = qkv.shape  # one token per row
        y = torch.ops.kiln.decode_attention_rope(qkv.reshape(B, -1), inputs.inv_freq, kv[0], kv[1], inputs.pad,
                                                 inputs.slot, self.scale, self.window or 0, self.n_heads)
        return y.reshape(B, T, self.n_heads * self.head_dim)


class FusedMatvecBlock(Block):
    """A decode step's layer as four launches of kiln's matrix-vector kernel around the attention:
    RMSNorm + wqkv, wo + the residual add, RMSNorm + w_gate_up, SwiGLU + w_down + the residual add.
    Where a projection is the model's own matmul, its norm's input is said to come from kiln's
    kernel when the projection that wrote it is kiln's (x: the layer before's w_down, whose shape
    this layer's shares; the first layer's x comes from the embedding, one norm of the step)."""

    _plain_class = Block

    def forward(self, x: Tensor, inputs: AttentionInputs, kv: tuple[Tensor, Tensor] | None) -> Tensor:
        if not inputs.decoding:
            return super().forward(x, inputs, kv)
        attn, ffn = self.attn, self.ffn
        y = attn.core(fused_linear(attn.wqkv, x, norm=self.attn_norm, after_kernel=kernel_writes(ffn.w_down, x)),
                      inputs, kv)
        x = fused_linear(attn.wo, y, residual=x)
        return fused_mlp(ffn, x, self.ffn_norm, x, after_kernel=kernel_writes(attn.wo, y))


class FusedMatvecDecoder(Decoder):
    """A decode step's final norm and lm_head as one launch of kiln's matrix-vector kernel."""

    _plain_class = Decoder

    def logits(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        if not inputs.decoding:
            return super().logits(x, inputs)
        return fused_linear(self.lm_head, x, norm=self.norm, after_kernel=kernel_writes(self.layers[-1].ffn.w_down, x))


def _attention_class(kernel: str, attn: Attention) -> type[Attention] | None:
    if kernel == "flash" and attn.window is None:
        return FlashDecodeAttention
    if kernel == "triton":
        return TritonRopeDecodeAttention if attn.q_norm is None else TritonDecodeAttention
    return None


def use_decode_kernels(model: Decoder, *, attention: str = "matmul", matvec: str = "inductor") -> Decoder:
    """Give `model`'s decode steps the attention kernel `attention` (`matmul`: the model's own,
    `flash`, `triton`) and the projections `matvec` (`inductor`: the plain modules, `triton`), in
    place; returns `model`. Names are resolved kernels, not `auto`: where each can run is checked
    by kiln.llm.decode_attention.check and kiln.llm.decode_matvec.check (kiln.llm.engine.Engine
    calls them first); this only swaps, so tests can run the Triton kernels under its interpreter."""
    if attention not in KERNELS or attention == "auto":
        raise ValueError(f"attention must be one of {', '.join(k for k in KERNELS if k != 'auto')}, "
                         f"got {attention!r} (resolve `auto` with kiln.llm.decode_attention.check)")
    if matvec not in CHOICES or matvec == "auto":
        raise ValueError(f"matvec must be one of {', '.join(c for c in CHOICES if c != 'auto')}, got {matvec!r} "
                         "(resolve `auto` with kiln.llm.decode_matvec.check)")
    if not isinstance(model, Decoder) or wrapped(model) or any(not isinstance(b, Block) or wrapped(b) for b in model.layers):
        raise TypeError(f"use_decode_kernels takes kiln's plain Decoder for generation, got {type(model).__name__} "
                        "(not one wrapped for training: checkpointing, FSDP)")
    for kernel, plain in (("decode_attention", attention == "matmul"), ("decode_matvec", matvec == "inductor")):
        if not plain and not takes_kernel(model.config.family, kernel):
            raise ValueError(f"{model.config.family} models do not take kiln's {kernel} kernels (their family spec)")
    fused = matvec == "triton"
    for block in model.layers:
        swap_class(block.attn, _attention_class(attention, block.attn))
        swap_class(block, FusedMatvecBlock if fused else None)
    swap_class(model, FusedMatvecDecoder if fused else None)
    return model
