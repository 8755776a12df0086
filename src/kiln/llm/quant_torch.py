"""kiln's own weight-only linear layers on torch's ops (`--quant-backend torch`): no torchao needed.

- `Int8WeightOnlyLinear`: int8 weights, symmetric, one scale per output channel (or per group of
  `group_size` input features). Forward is `linear(x, w.to(x.dtype)) * scale`: at batch 1 with
  inductor's coordinate-descent tuning on CUDA, an M=1 matmul is lowered to a reduction
  (torch/_inductor/decomposition.py, `mm`), so the int8 -> bf16 cast fuses into it and each step
  reads one byte per weight. This is the recipe gpt-fast published; the code is kiln's.
- `Int4WeightOnlyLinear`: 4-bit asymmetric groups along the input dimension (min/max per group),
  packed for torch's tinygemm kernel (`aten._weight_int4pack_mm`, CUDA, bf16 activations; on
  CPU `aten._weight_int4pack_mm_for_cpu`). The kernel's convention is
  `w = (q - 8) * scale + zero` with `q` in [0, 15], scales and zeros as `[in/group, out, 2]`.
- `Int4FusedLinear` (`--quant-backend inductor`): the same 4-bit groups, stored as plain bytes
  (first half of the input features in the low nibbles, second half in the high ones) and
  dequantized with ordinary tensor ops. For one token, forward is written as the matrix-vector
  reduction itself, so inductor emits one kernel that reads each byte once, unpacks, scales and
  accumulates, fused with its neighbours like every other decode kernel (no extern call, no
  tinygemm tiling); for longer inputs it dequantizes the weight and calls `linear`.
All keep their tensors as buffers, so `model.to()`, byte counts and CUDA graphs see them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

INT4_GROUP_SIZES = (32, 64, 128, 256)
"""Group sizes torch's tinygemm kernel accepts (`qGroupSize`)."""


def int4_inner_k_tiles(in_features: int) -> int | None:
    """The tinygemm tiling for `in_features` on CUDA (the input dim must be a multiple of 16 x tiles)."""
    return next((t for t in (8, 4, 2) if in_features % (16 * t) == 0), None)


class Int8WeightOnlyLinear(nn.Module):
    def __init__(self, weight: Tensor, scale: Tensor, bias: Tensor | None, group_size: int | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.group_size = group_size
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.bias = bias

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, group_size: int | None = None) -> Int8WeightOnlyLinear:
        w = linear.weight.detach().float()
        out_f, in_f = w.shape
        grouped = w.view(out_f, in_f // group_size, group_size) if group_size else w.unsqueeze(1)
        scale = (grouped.abs().amax(dim=-1, keepdim=True) / 127).clamp(min=1e-12)
        q = (grouped / scale).round().clamp(-127, 127).to(torch.int8).view(out_f, in_f)
        scale = scale.squeeze(-1).to(linear.weight.dtype)  # [out, groups]
        return cls(q, scale if group_size else scale.squeeze(-1), linear.bias, group_size)

    def dequantize(self) -> Tensor:
        if self.group_size is None:
            return self.weight.to(self.scale.dtype) * self.scale[:, None]
        groups = self.weight.view(self.out_features, -1, self.group_size).to(self.scale.dtype)
        return (groups * self.scale[..., None]).view(self.out_features, self.in_features)

    def forward(self, x: Tensor) -> Tensor:
        if self.group_size is None:
            y = F.linear(x, self.weight.to(x.dtype)) * self.scale.to(x.dtype)
        else:
            y = F.linear(x, self.dequantize().to(x.dtype))
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        groups = f"group_size={self.group_size}" if self.group_size else "per-channel"
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 {groups}"


def _int4_groups(w: Tensor, group_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """q in [0, 15] (int32, [out, in]), scale and zero ([out, in/group]) in fp32, tinygemm's convention."""
    out_f, in_f = w.shape
    groups = w.float().view(out_f, in_f // group_size, group_size)
    lo, hi = groups.amin(dim=-1, keepdim=True), groups.amax(dim=-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-6)
    q = ((groups - lo) / scale).round().clamp(0, 15).to(torch.int32).view(out_f, in_f)
    zero = lo + 8 * scale
    return q, scale.squeeze(-1), zero.squeeze(-1)


class Int4WeightOnlyLinear(nn.Module):
    def __init__(self, packed: Tensor, scales_and_zeros: Tensor, bias: Tensor | None, *, in_features: int,
                 out_features: int, group_size: int):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer("weight", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.bias = bias

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, group_size: int) -> Int4WeightOnlyLinear:
        w = linear.weight.detach()
        out_f, in_f = w.shape
        q, scale, zero = _int4_groups(w, group_size)
        sz_dtype = torch.bfloat16 if w.is_cuda else w.dtype  # tinygemm on CUDA reads bf16 scales
        sz = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(sz_dtype)  # [in/g, out, 2]
        if w.is_cuda:
            # CUDA takes two 4-bit values per byte, high nibble first (torch >= 2.5).
            packed = torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8),
                                                                int4_inner_k_tiles(in_f))
        else:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 8)
        return cls(packed, sz, linear.bias, in_features=in_f, out_features=out_f, group_size=group_size)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)
        if x.is_cuda:
            y = torch.ops.aten._weight_int4pack_mm(flat, self.weight, self.group_size, self.scales_and_zeros)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.weight, self.group_size,
                                                           self.scales_and_zeros.to(flat.dtype))
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 group_size={self.group_size}"


def int4_reference(linear: nn.Linear, group_size: int, params_dtype: torch.dtype = torch.float32) -> Tensor:
    """The dequantized weight `Int4WeightOnlyLinear` computes with (fp32, scales and zeros rounded to
    `params_dtype` as the layer stores them), for checking the packing and the kernel."""
    q, scale, zero = _int4_groups(linear.weight.detach(), group_size)
    scale, zero = scale.to(params_dtype).float(), zero.to(params_dtype).float()
    out_f, in_f = q.shape
    groups = (q.view(out_f, -1, group_size).float() - 8) * scale[..., None] + zero[..., None]
    return groups.view(out_f, in_f)


class Int4FusedLinear(nn.Module):
    def __init__(self, packed: Tensor, scale: Tensor, offset: Tensor, bias: Tensor | None, *, group_size: int):
        super().__init__()
        self.out_features, half = packed.shape
        self.in_features, self.group_size = 2 * half, group_size
        self.register_buffer("weight", packed)  # uint8 [out, in/2]
        self.register_buffer("scale", scale)  # [out, in/group]: w = q * scale + offset
        self.register_buffer("offset", offset)
        self.bias = bias

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, group_size: int) -> Int4FusedLinear:
        w = linear.weight.detach()
        q, scale, zero = _int4_groups(w, group_size)
        half = w.shape[1] // 2
        packed = (q[:, :half] | (q[:, half:] << 4)).to(torch.uint8)
        offset = zero - 8 * scale  # (q - 8) * scale + zero == q * scale + offset
        return cls(packed, scale.to(w.dtype), offset.to(w.dtype), linear.bias, group_size=group_size)

    def _halves(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Dequantized halves of the weight, [out, in/2/group, group] each."""
        n, g = self.out_features, self.group_size
        groups = self.in_features // g // 2
        scale, offset = self.scale.to(dtype), self.offset.to(dtype)
        lo = (self.weight & 15).view(n, groups, g).to(dtype)
        hi = (self.weight >> 4).view(n, groups, g).to(dtype)
        return (lo * scale[:, :groups, None] + offset[:, :groups, None],
                hi * scale[:, groups:, None] + offset[:, groups:, None])

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        lo, hi = self._halves(dtype or self.scale.dtype)
        return torch.cat([lo.flatten(1), hi.flatten(1)], dim=1)

    def forward(self, x: Tensor) -> Tensor:
        if x.numel() != self.in_features:  # prefill, batches: dequantize, then a regular matmul
            y = F.linear(x, self.dequantize(x.dtype))
        else:  # one token: the reduction itself, for inductor to fuse with the unpacking
            lo, hi = self._halves(x.dtype)
            x_lo, x_hi = x.reshape(2, 1, -1, self.group_size).unbind(0)
            y = ((lo * x_lo).sum(dim=(1, 2), dtype=torch.float32)
                 + (hi * x_hi).sum(dim=(1, 2), dtype=torch.float32)).to(x.dtype).view(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 fused group_size={self.group_size}"
