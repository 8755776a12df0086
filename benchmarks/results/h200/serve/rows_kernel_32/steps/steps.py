"""kiln serve's own decode step (kiln.serve.rows, greedy, 3B shape, bf16, 32 rows x 1,024 slots, buckets
1/16/32) under module settings given in KILN_SETTINGS (benchmarks/with_settings.py's MODULE.NAME=VALUE).
Rows 0-15 join first (512-token prompts from slot 0: the engine's layout for bucket 16), rows 16-23
60 steps later and rows 24-31 60 steps after that (a server's staggered rows in bucket 32). Then GPU
ms per step of buckets 1, 16, 32: 3 interleaved rounds of 20 replays, median.
`KILN_SETTINGS="..." python steps.py LABEL OUT.json` from the repo root of a GPU machine."""
import json
import os
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from with_settings import apply_settings  # noqa: E402

from kiln.llm import build_decoder, resolve_model  # noqa: E402
from kiln.llm.engine import default_inductor_options  # noqa: E402
from kiln.llm.kernels import use_decode_kernels  # noqa: E402
from kiln.serve.rows import Rows, RowSettings  # noqa: E402

label, out = sys.argv[1], sys.argv[2]
settings = os.environ.get("KILN_SETTINGS", "").split()
print(label, apply_settings(settings))
dev = torch.device("cuda")
t0 = time.perf_counter()
model = build_decoder(resolve_model("llama-3.2-3b"), device=dev, dtype=torch.bfloat16, seed=0)
use_decode_kernels(model, attention="triton", matvec="triton")
rows = Rows(model.eval(), rows=32, capacity=1024, compile=True, cuda_graphs=True, buckets=[1, 16, 32],
            inductor_options=default_inductor_options(dev), compile_scope="blocks")
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(1000, 128000, (512,), generator=g).tolist() for _ in range(32)]
greedy = RowSettings(temperature=0.0)
for group in (range(0, 16), range(16, 24), range(24, 32)):
    assert rows.place(512, 300)
    rows.join_many([(r, prompts[r], 300, greedy) for r in group])
    if group.start < 24:
        for _ in range(60):
            launched = rows.launch()
            rows.collect(launched)
torch.cuda.synchronize()
starts = sorted(set(rows.busy.values()))
warm = {"setup_s": time.perf_counter() - t0}
buckets = [1, 16, 32]
for n in buckets:
    t = time.perf_counter()
    while (n, True) not in rows._graphs:
        rows._run(n, True)
    torch.cuda.synchronize()
    warm[f"b{n}_s"] = time.perf_counter() - t
times = {f"b{n}": [] for n in buckets}
for _ in range(3):
    for n in buckets:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            rows._run(n, True)
        b.record()
        torch.cuda.synchronize()
        times[f"b{n}"].append(a.elapsed_time(b) / 20)
med = {k: sorted(v)[1] for k, v in times.items()}
print(label, json.dumps({k: round(v, 4) for k, v in med.items()}), json.dumps({k: round(v, 1) for k, v in warm.items()}),
      "row starts", starts, "cursor", rows.cursor)
json.dump({"label": label, "settings": settings, "median_ms": med, "rounds_ms": times, "warm_s": warm,
           "row_starts": starts}, open(out, "w"), indent=1)
