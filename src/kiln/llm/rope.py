"""Rotary position embeddings in the layout Hugging Face checkpoints are trained for.

HF Llama-family weights rotate the two *halves* of each head (`rotate_half`), not interleaved
pairs, so q/k projections load without permutation. Angles are computed in fp32 from integer
positions each call, so a per-row position offset (left padding) costs nothing and there is no
table sized to the longest sequence. Inference lets inductor fuse that computation into the
rotary kernels; a compiled training step computes it once, as an opaque op (`rope_cos_sin`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from kiln.llm.decoder_config import RopeConfig


def inv_frequencies(rope: RopeConfig, head_dim: int, device: torch.device | str | None = None) -> Tensor:
    """Per-pair rotation frequencies (fp32, head_dim // 2 of them) after the config's scaling."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv = 1.0 / (rope.theta**exponents)
    if rope.kind == "linear":
        return inv / rope.factor
    if rope.kind == "llama3":
        return _llama3_bands(inv, rope)
    return inv


def _llama3_bands(inv: Tensor, rope: RopeConfig) -> Tensor:
    """Llama 3.1's long-context scaling: wavelengths longer than the original context divided by
    `low_freq_factor` are stretched by `factor`, those shorter than it divided by
    `high_freq_factor` are kept, and the band between is interpolated linearly in 1/wavelength."""
    wavelen = 2 * math.pi / inv
    long_wave = rope.original_max_positions / rope.low_freq_factor
    short_wave = rope.original_max_positions / rope.high_freq_factor
    stretched = torch.where(wavelen > long_wave, inv / rope.factor, inv)
    smooth = (rope.original_max_positions / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor)
    interpolated = (1 - smooth) * stretched / rope.factor + smooth * stretched
    between = (wavelen >= short_wave) & (wavelen <= long_wave)
    return torch.where(between, interpolated, stretched)


class Rotary(nn.Module):
    """Holds the frequencies; `forward(positions)` gives cos/sin shaped [B, T, 1, head_dim]."""

    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.rope, self.head_dim = rope, head_dim
        self.register_buffer("inv_freq", inv_frequencies(rope, head_dim), persistent=False)

    def _apply(self, fn, recurse=True):
        # `model.to(torch.bfloat16)` must not round the frequencies, and `to_empty` (meta-device
        # construction) must not leave them uninitialised: follow the device only, recompute.
        device = fn(self.inv_freq).device
        self.inv_freq = inv_frequencies(self.rope, self.head_dim, device)
        return self

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        if torch.is_grad_enabled() and torch.compiler.is_compiling():
            # Training under torch.compile: through an op inductor cannot see into, so cos/sin are
            # computed once per step and saved for the backward. Inlined, inductor recomputes the
            # angles, sin and cos in every layer's rotary kernels, forward and backward, several
            # times slower than reading saved values (the rope_probe results README).
            return rope_cos_sin(positions, self.inv_freq, dtype)
        return _cos_sin(positions, self.inv_freq, dtype)


def _cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    angles = positions.float()[..., None] * inv_freq  # [B, T, head_dim // 2], fp32
    angles = torch.cat((angles, angles), dim=-1)[:, :, None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


@torch.library.custom_op("kiln::rope_cos_sin", mutates_args=())
def rope_cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin [B, T, 1, head_dim] of `positions` [B, T] (an opaque op for compiled training)."""
    return _cos_sin(positions, inv_freq, dtype)


@rope_cos_sin.register_fake
def _(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    shape = (*positions.shape, 1, 2 * inv_freq.shape[0])
    return positions.new_empty(shape, dtype=dtype), positions.new_empty(shape, dtype=dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate [B, T, heads, head_dim] by the angles; the second half pairs with the first."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
