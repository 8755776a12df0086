"""kiln::keep_threshold's launch settings on a GPU: each (BLOCK_V, NUM_WARPS, TARGET_PROGRAMS) timed as a
CUDA graph at 1 and 32 rows of the 3B's vocabulary, top_p 0.95 with top_k 0 (one search) and with
top_k 50 (both), interleaved rounds, median us; the sort's keep mask beside it; and the check
against the sort at the settings. `python top_sweep.py OUT.json`."""
import itertools
import json
import sys

import torch

import kiln.kernels.triton_top as tt
from kiln.serve.row_sampling import kept_by_sort

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
V = 128256
SETTINGS = [(256, 4, 512), (256, 4, 1024), (256, 8, 512), (512, 4, 512), (512, 8, 512), (512, 8, 1024),
            (1024, 8, 512), (256, 4, 256)]


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


def use(setting):
    tt.BLOCK_V, tt.NUM_WARPS, tt.TARGET_PROGRAMS = setting


out = {"check": [], "median_us": {}}
for setting in SETTINGS:  # the check at every setting, on rows with ties and both searches
    use(setting)
    bad = 0
    for trial in range(4):
        logits = torch.randn(32, V, device=dev, generator=g) * (1 + trial)
        if trial % 2:
            logits = torch.round(logits * 4) / 4
        probs = torch.softmax(logits, -1)
        top_k = torch.where(torch.arange(32, device=dev) % 2 == 1, torch.randint(1, 3000, (32,), device=dev, generator=g), 0)
        top_p = torch.where(torch.arange(32, device=dev) % 3 == 0, 1.0, torch.rand(32, device=dev, generator=g))
        a = probs.view(torch.int32) >= torch.ops.kiln.keep_threshold(probs, top_k, top_p)[:, None]
        bad += int((a != kept_by_sort(probs, top_k, top_p)).any(1).sum())
    out["check"].append({"setting": setting, "rows_differing": bad})
print("check", json.dumps(out["check"]))
for B, k in itertools.product((1, 32), (0, 50)):
    probs = torch.softmax(torch.randn(B, V, device=dev, generator=g) / 0.8, -1)
    top_k = torch.full((B,), k, dtype=torch.long, device=dev)
    top_p = torch.full((B,), 0.95, device=dev)
    graphs = {}
    for setting in SETTINGS:
        use(setting)
        graphs["%d/%d/%d" % setting] = graph_of(lambda: probs.view(torch.int32) >= torch.ops.kiln.keep_threshold(probs, top_k, top_p)[:, None])  # noqa: B023, UP031  (captured at once, in the loop)
    graphs["sort"] = graph_of(lambda: kept_by_sort(probs, top_k, top_p))  # noqa: B023  (captured at once, in the loop)
    rounds = {name: [] for name in graphs}
    for _ in range(5):
        for name, gr in graphs.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(50):
                gr.replay()
            b.record()
            torch.cuda.synchronize()
            rounds[name].append(a.elapsed_time(b) / 50 * 1e3)
    med = {name: round(sorted(v)[2], 1) for name, v in rounds.items()}
    out["median_us"][f"b{B}_k{k}"] = med
    print(f"b{B}_k{k}", json.dumps(med))
json.dump(out, open(sys.argv[1], "w"), indent=1)
