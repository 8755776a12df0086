"""GPU: kiln's rmsnorm_rows against kiln's RMSNorm in eager, bf16, 16 and 32 rows."""
import torch

from kiln.kernels.triton_rmsnorm import rmsnorm_rows
from kiln.llm.model import RMSNorm

torch.manual_seed(0)
for rows in (2, 16, 32, 64):
    n = RMSNorm(3072, 1e-5).to("cuda", torch.bfloat16)
    with torch.no_grad():
        n.weight.copy_(torch.randn(3072))
    x = torch.randn(rows, 3072, device="cuda", dtype=torch.bfloat16) * 3
    a, b = n(x), rmsnorm_rows(x, n.weight, 1e-5)
    print(f"rows {rows}: max abs diff {(a.float() - b.float()).abs().max().item():.3e}, "
          f"elements differing {(a != b).float().mean().item():.2e}")
