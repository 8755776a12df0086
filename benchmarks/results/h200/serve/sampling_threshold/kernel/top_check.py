"""GPU check of kiln::keep_threshold (kiln.kernels.triton_top) against kiln.serve.row_sampling.kept_by_sort
on 3B-vocabulary rows, then both timed as CUDA graphs (interleaved rounds, median): the kernel's
threshold + keep mask against the sort's keep mask, at 1 and 32 rows. `python top_check.py OUT.json`."""
import json
import sys

import torch

import kiln.kernels.triton_top  # noqa: F401
from kiln.serve.row_sampling import kept_by_sort

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
V = 128256
mismatch = []
for trial in range(24):
    B = 32
    logits = torch.randn(B, V, device=dev, generator=g) * (0.5 + trial % 6)
    if trial % 4 == 0:
        logits = torch.round(logits * 4) / 4  # ties
    probs = torch.softmax(logits / 0.8, -1)
    top_k = torch.where(torch.rand(B, device=dev, generator=g) < 0.5,
                        torch.randint(1, 2000, (B,), device=dev, generator=g), 0)
    top_p = torch.where(torch.rand(B, device=dev, generator=g) < 0.3, 1.0, torch.rand(B, device=dev, generator=g))
    a = probs.view(torch.int32) >= torch.ops.kiln.keep_threshold(probs, top_k, top_p)[:, None]
    b = kept_by_sort(probs, top_k, top_p)
    rows = (a != b).any(1)
    mismatch.append({"trial": trial, "rows_differing": int(rows.sum()), "tokens_differing": int((a != b).sum()),
                     "kept_tokens": int(a.sum())})
print("check", json.dumps(mismatch))


def graph_of(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        fn()
    return gr


times = {}
for B in (1, 32):
    probs = torch.softmax(torch.randn(B, V, device=dev, generator=g) / 0.8, -1)
    top_k = torch.zeros(B, dtype=torch.long, device=dev)
    top_p = torch.full((B,), 0.95, device=dev)
    graphs = {"kernel": graph_of(lambda: probs.view(torch.int32) >= torch.ops.kiln.keep_threshold(probs, top_k, top_p)[:, None]),  # noqa: B023  (captured at once, in the loop)
              "sort": graph_of(lambda: kept_by_sort(probs, top_k, top_p))}  # noqa: B023  (captured at once, in the loop)
    rounds = {k: [] for k in graphs}
    for _ in range(5):
        for k, gr in graphs.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(50):
                gr.replay()
            b.record()
            torch.cuda.synchronize()
            rounds[k].append(a.elapsed_time(b) / 50 * 1e3)
    times[f"b{B}"] = {k: sorted(v)[2] for k, v in rounds.items()}
    times[f"b{B}_rounds_us"] = rounds
print("times_us", json.dumps({k: v for k, v in times.items() if "rounds" not in k}))
json.dump({"check": mismatch, "median_us": times}, open(sys.argv[1], "w"), indent=1)
