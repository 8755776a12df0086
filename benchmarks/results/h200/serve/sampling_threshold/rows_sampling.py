"""The server's decode step (kiln.serve.rows) with 32 rows, 3B shape, bf16, 512-token prompts joined
with sampled settings (temperature 0.8, top_p 0.95, half the rows also top_k 50): seconds to warm
each captured variant (compile + capture, cold cache), then GPU ms per step of batch 1 and 32,
greedy-only and sampled, 3 interleaved rounds of 20 steps (the 1,024-slot rows hold 512 steps after the prompts); then a profile of the sampled batch-32
step. Then batch 1 and 32 sampled again with every row's top_k 0. FORM=broadcast swaps the search's per-candidate sums for one broadcast reduction.
`python rows_sampling.py LABEL OUT.json` from the repo root of a GPU machine."""
import json
import os
import sys
import time

import torch

import kiln.serve.row_sampling as rs
from kiln.llm import build_decoder, resolve_model
from kiln.llm.engine import default_inductor_options
from kiln.llm.kernels import use_decode_kernels
from kiln.serve.rows import Rows, RowSettings

label, out = sys.argv[1], sys.argv[2]
form = os.environ.get("FORM", "sums")
if form == "broadcast" and hasattr(rs, "_largest_reaching"):
    def _broadcast(bits, weight, target, lo):
        hi = torch.full_like(lo, 1 << 31)
        steps = torch.arange(1, rs.SEARCH_WAYS, device=bits.device)
        for _ in range(rs._SEARCH_PASSES):
            cands = lo[:, None] + ((hi - lo)[:, None] * steps + rs.SEARCH_WAYS - 1) // rs.SEARCH_WAYS
            sums = torch.where(bits[:, :, None] >= cands[:, None, :], weight[:, :, None], 0).sum(1)
            ok = sums >= target[:, None]
            lo = torch.maximum(lo, torch.where(ok, cands, lo[:, None]).amax(-1))
            hi = torch.minimum(hi, torch.where(ok, hi[:, None], cands).amin(-1))
        return lo
    rs._largest_reaching = _broadcast
dev = torch.device("cuda")
model = build_decoder(resolve_model("llama-3.2-3b"), device=dev, dtype=torch.bfloat16, seed=0)
use_decode_kernels(model, attention="triton", matvec="triton")
rows = Rows(model.eval(), rows=32, capacity=1024, compile=True, cuda_graphs=True, buckets=[1, 32],
            inductor_options=default_inductor_options(dev), compile_scope="blocks")
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(1000, 128000, (512,), generator=g).tolist() for _ in range(32)]
assert rows.place(512, 500)
t = time.perf_counter()
rows.join_many([(r, prompts[r], 500, RowSettings(temperature=0.8, top_p=0.95, top_k=50 if r % 2 else 0, seed=r))
                for r in range(32)])
torch.cuda.synchronize()
warm = {"join_s": time.perf_counter() - t}
keys = [(1, True), (1, False), (32, True), (32, False)]
for key in keys:
    t = time.perf_counter()
    while key not in rows._graphs:
        rows._run(*key)
    torch.cuda.synchronize()
    warm[f"b{key[0]}_{'greedy' if key[1] else 'sampled'}_s"] = time.perf_counter() - t
name = {k: f"b{k[0]}_{'greedy' if k[1] else 'sampled'}" for k in keys}
times = {name[k]: [] for k in keys}
for _ in range(3):
    for k in keys:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            rows._run(*k)
        b.record()
        torch.cuda.synchronize()
        times[name[k]].append(a.elapsed_time(b) / 20)
rows.buf.top_k.zero_()  # every row top_p only (top_k 0), as most requests ask
for _ in range(3):
    for n in (1, 32):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            rows._run(n, False)
        b.record()
        torch.cuda.synchronize()
        times.setdefault(f"b{n}_sampled_topk0", []).append(a.elapsed_time(b) / 20)
med = {k: sorted(v)[1] for k, v in times.items()}
print(label, form, json.dumps({k: round(v, 4) for k, v in med.items()}), json.dumps({k: round(v, 1) for k, v in warm.items()}))
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        rows._run(32, False)
    torch.cuda.synchronize()
table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=90)
print(table)
json.dump({"label": label, "form": form, "median_ms": med, "rounds_ms": times, "warm_s": warm,
           "profile_b32_sampled": table}, open(out, "w"), indent=1)
