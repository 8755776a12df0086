"""kiln's own Vision Transformer, shaped like timm's `vit_base_patch16_224` at its defaults.

Written here (instead of requiring timm) so the ViT workloads of the seed articles run on a bare
install, and so kiln controls the code compile sees: attention is one
`F.scaled_dot_product_attention` call (flash / memory-efficient kernels on GPU) and there is no
Python-side control flow in forward that could break the graph.
Parameter names follow timm (`patch_embed.proj`, `blocks.N.attn.qkv`, ...) to ease comparisons.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln.errors import ConfigError
from kiln.models.spec import InputSpec


class PatchEmbed(nn.Module):
    """Non-overlapping patches -> tokens via a strided conv (as timm), (B,C,H,W) -> (B, N, D)."""

    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int):
        super().__init__()
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


ATTN_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")


def sdpa_backends(name: str) -> list | None:
    """The SDPA kernel(s) `model.kwargs.attn_backend` asks for; None lets torch choose."""
    if name == "auto":
        return None
    from torch.nn.attention import SDPBackend

    return [{"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name]]


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int, qkv_bias: bool, attn_drop: float, proj_drop: float,
                 attn_backend: str = "auto"):
        super().__init__()
        self.backends = sdpa_backends(attn_backend)
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        # SDPA picks the fused kernel for the device/dtype unless a backend was chosen (dynamo
        # traces the sdpa_kernel context); dropout only while training.
        drop = self.attn_drop if self.training else 0.0
        if self.backends is None:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)
        else:
            from torch.nn.attention import sdpa_kernel

            with sdpa_kernel(self.backends):
                x = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, drop: float):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class ViTBlock(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, qkv_bias: bool, drop: float, attn_drop: float,
                 attn_backend: str = "auto"):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_drop, drop, attn_backend)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(
        self,
        img_size: int,
        patch_size: int,
        in_chans: int,
        num_classes: int,
        embed_dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float,
        qkv_bias: bool,
        drop_rate: float,
        attn_drop_rate: float,
        attn_backend: str = "auto",
    ):
        super().__init__()
        self.num_classes = num_classes
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.patch_embed.num_patches, embed_dim))
        self.pos_drop = nn.Dropout(drop_rate)
        self.blocks = nn.ModuleList(
            ViTBlock(embed_dim, num_heads, mlp_ratio, qkv_bias, drop_rate, attn_drop_rate, attn_backend)
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            # Conv patch embedding and LayerNorms keep torch's defaults (as timm's default init).

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = self.pos_drop(torch.cat((cls, x), dim=1) + self.pos_embed)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Classify from the class token (timm's global_pool="token").
        return self.head(self.head_drop(self.forward_features(x)[:, 0]))


def build_vit(
    img_size: int = 224,
    patch_size: int = 16,
    in_chans: int = 3,
    num_classes: int = 1000,
    embed_dim: int = 768,
    depth: int = 12,
    num_heads: int = 12,
    mlp_ratio: float = 4.0,
    qkv_bias: bool = True,
    drop_rate: float = 0.0,
    attn_drop_rate: float = 0.0,
    attn_backend: str = "auto",
) -> VisionTransformer:
    """ViT-B/16 at the defaults (86,567,656 parameters, as timm's vit_base_patch16_224).
    `attn_backend` pins the SDPA kernel (`flash`, `efficient`, `cudnn`, `math`); `auto` lets torch pick."""
    if attn_backend not in ATTN_BACKENDS:
        raise ConfigError("model.kwargs.attn_backend", f"unknown value {attn_backend!r}", ATTN_BACKENDS)
    for name, value in (
        ("img_size", img_size),
        ("patch_size", patch_size),
        ("in_chans", in_chans),
        ("embed_dim", embed_dim),
        ("depth", depth),
        ("num_heads", num_heads),
    ):
        if value < 1:
            raise ConfigError(f"model.kwargs.{name}", f"must be >= 1, got {value!r}")
    if num_classes < 0:
        raise ConfigError("model.kwargs.num_classes", f"must be >= 0 (0 = no head), got {num_classes!r}")
    if img_size % patch_size:
        raise ConfigError("model.kwargs.patch_size", f"must divide img_size={img_size}, got {patch_size}")
    if embed_dim % num_heads:
        raise ConfigError("model.kwargs.num_heads", f"must divide embed_dim={embed_dim}, got {num_heads}")
    if mlp_ratio <= 0:
        raise ConfigError("model.kwargs.mlp_ratio", f"must be > 0, got {mlp_ratio!r}")
    for name, value in (("drop_rate", drop_rate), ("attn_drop_rate", attn_drop_rate)):
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"model.kwargs.{name}", f"must be in [0, 1), got {value!r}")
    return VisionTransformer(
        img_size,
        patch_size,
        in_chans,
        num_classes,
        embed_dim,
        depth,
        num_heads,
        mlp_ratio,
        qkv_bias,
        drop_rate,
        attn_drop_rate,
        attn_backend,
    )


def vit_input_spec(kwargs: dict) -> InputSpec:
    size = kwargs["img_size"]
    return InputSpec("images", (kwargs["in_chans"], size, size), num_classes=kwargs["num_classes"] or None)
