"""Staging time of an async checkpoint's state through kiln's PinnedStaging, the first save and the
next two, on one GPU: DCP's copier kept open across saves (`kept`, kiln's default where DefaultStager
stages only once, as on torch 2.11) against a fresh stager per save (`fresh`). The state is GIB
tensors of 1 GiB (fp32) on the GPU, changed between saves; each staged copy is checked.

    python benchmarks/stage_probe.py [GIB]      # writes $OUT/stage_probe.json (default /tmp)
"""
import json
import os
import sys
import time

import torch

from kiln.checkpoint import save_timing
from kiln.checkpoint.save_timing import PinnedStaging, stager_reusable

gib = int(sys.argv[1]) if len(sys.argv) > 1 else 24
out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "gib": gib, "reusable": stager_reusable()}
state = {"model": {f"p{i}": torch.randn(256, 1024, 1024, device="cuda") for i in range(gib)}, "step": 1}
keep_open = save_timing.keep_open
for mode in ("kept", "fresh", "kept"):
    save_timing.keep_open = keep_open if mode == "kept" else (lambda stager: None)
    staging = PinnedStaging(reusable=lambda: False)
    times = []
    for _ in range(3):
        stager = staging.kwargs()["async_stager"]
        t0 = time.perf_counter()
        staged = stager.stage(state)
        times.append(round(time.perf_counter() - t0, 3))
        ok = torch.equal(staged["model"]["p0"][0, 0, :8], state["model"]["p0"][0, 0, :8].cpu())
        for p in state["model"].values():
            p.add_(1.0)
        del staged
    staging.close()
    out.setdefault(mode, []).append({"stage_s": times, "copy_ok": ok})
    print(mode, times, ok, flush=True)
print(json.dumps(out))
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "stage_probe.json"), "w"), indent=1)
