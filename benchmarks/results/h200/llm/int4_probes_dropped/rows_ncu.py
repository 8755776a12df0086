"""int4 row kernel on the 3B's gate_up at ROWS rows, a few launches for ncu."""
import sys

import torch

import kiln.llm.int4_layout as L

rows = int(sys.argv[1])
torch.manual_seed(0)
lin = torch.nn.Linear(3072, 16384, bias=False, device="cuda", dtype=torch.bfloat16)
m = L.Int4TritonLinear.from_linear(lin, 128)
x = torch.randn(rows, 3072, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    y = m(x)
torch.cuda.synchronize()
print(L.int4_path(rows), y.shape, float(y.float().abs().mean()))
