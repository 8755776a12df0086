"""The server's decode step (kiln.serve.rows), 3B shape, bf16, 32 rows joined with 512-token prompts,
sampled settings: GPU ms per step of the captured graphs at batch 1 and 32, greedy-only and sampled,
interleaved rounds; then a profile of the sampled batch-32 step's kernels. Run on a GPU from the repo
root, `python benchmarks/results/h200/serve/decode_edges/rows_step.py LABEL SCOPE OUT.json` (SCOPE: blocks
or step; EDGE_TUNING=1 in the environment sets kiln.llm.block_compile.EDGE_TUNING)."""
import json
import os
import sys

import torch

from kiln.llm import build_decoder, resolve_model
from kiln.llm.engine import default_inductor_options
from kiln.llm.kernels import use_decode_kernels
from kiln.serve.rows import Rows, RowSettings

label, scope, out = sys.argv[1], sys.argv[2], sys.argv[3]
if os.environ.get("EDGE_TUNING") == "1":
    import kiln.llm.block_compile as block_compile

    block_compile.EDGE_TUNING = True
dev = torch.device("cuda")
model = build_decoder(resolve_model("llama-3.2-3b"), device=dev, dtype=torch.bfloat16, seed=0)
use_decode_kernels(model, attention="triton", matvec="triton")
rows = Rows(model.eval(), rows=32, capacity=1024, compile=True, cuda_graphs=True, buckets=[1, 32],
            inductor_options=default_inductor_options(dev), compile_scope=scope)
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(1000, 128000, (512,), generator=g).tolist() for _ in range(32)]
assert rows.place(512, 500)
rows.join_many([(r, prompts[r], 500, RowSettings(temperature=0.8, top_p=0.95, seed=r)) for r in range(32)])
keys = [(1, True), (1, False), (32, True), (32, False)]
for key in keys:
    for _ in range(3):
        rows._run(*key)
torch.cuda.synchronize()
times = {f"b{n}_{'greedy' if gr else 'sampled'}": [] for n, gr in keys}
for _ in range(3):
    for n, gr in keys:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(40):
            rows._run(n, gr)
        b.record()
        torch.cuda.synchronize()
        times[f"b{n}_{'greedy' if gr else 'sampled'}"].append(a.elapsed_time(b) / 40)
med = {k: sorted(v)[1] for k, v in times.items()}
print(label, scope, json.dumps({k: round(v, 4) for k, v in med.items()}), json.dumps(times))
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        rows._run(32, False)
    torch.cuda.synchronize()
table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=90)
print(table)
json.dump({"label": label, "scope": scope, "median_ms": med, "rounds_ms": times, "profile_b32_sampled": table},
          open(out, "w"), indent=1)
