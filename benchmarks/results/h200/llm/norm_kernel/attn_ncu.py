"""kiln's fused RoPE + cache write + decode attention at batch B over 640 slots (pos 576), for ncu."""
import sys

import torch

from kiln.kernels.triton_decode import launch_settings

B = int(sys.argv[1])
S, Hkv, H, D = 640, 8, 24, 128
ck = torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16)
cv = torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16)
qkv = torch.randn(B, (H + 2 * Hkv) * D, device="cuda", dtype=torch.bfloat16)
inv = 1.0 / (500000 ** (torch.arange(0, D, 2, device="cuda").float() / D))
pos = torch.tensor([576], device="cuda")
for _ in range(6):
    y = torch.ops.kiln.decode_attention_rope(qkv, inv, ck, cv, None, pos, D ** -0.5, 0, H)
torch.cuda.synchronize()
print("settings (block, per_chunk, chunks, warps):", launch_settings(B, Hkv, S), y.shape)
