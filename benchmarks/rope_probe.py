"""Where the RoPE kernels of kiln's compiled decoder spend their time (1B shape, forward + backward).

`kiln profile` of the bf16-master recipe on the Llama-3.2-1B shape (compile.scope=model+loss) found
one inductor kernel per layer, the rotary's backward fused with the concatenation of the q/k/v
gradients, at ~344 us per call: ~10x what its bytes take at the GPU's bandwidth. Its name says it
recomputes the angles (arange, cos, sin) from the positions. This script times the same model three
ways, forward + backward + loss, no optimizer:

- `whole`: the model and loss compiled as one function (the rotary's cos/sin computed inside);
- `table`: the same, with cos/sin computed once outside the compiled function and passed in
  (what a cached table gives the compiled code);
- `regional`: each block compiled on its own (cos/sin computed eagerly between them).

For each: median step time of interleaved rounds, and per-kernel GPU time from torch.profiler.

    python benchmarks/rope_probe.py --layers 4 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

from kiln.llm import ModelSource, build_decoder, resolve_model
from kiln.timing import measure_interleaved


def build(layers: int, device: torch.device):
    source = resolve_model("llama-3.2-1b")
    raw = {**source.raw, "num_hidden_layers": layers, "tie_word_embeddings": False}
    return build_decoder(ModelSource(source.spec, raw, None), device=device, dtype=torch.bfloat16)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    tokens = torch.randint(0, 128000, (args.batch, args.seq + 1), device=device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    models, steps = {}, {}
    for name in ("whole", "table", "regional"):
        model = build(args.layers, device).train()
        model.requires_grad_(True)
        if name == "table":
            positions = torch.arange(args.seq, device=device).view(1, -1).expand(args.batch, -1)
            cos, sin = model.rotary(positions, torch.bfloat16)
            model.rotary.forward = lambda positions, dtype, c=cos, s=sin: (c, s)
        if name == "regional":
            for block in model.layers:
                block.compile()
            fn = lambda m=model: F.cross_entropy(m(x).flatten(0, 1).float(), y.flatten())  # noqa: E731
        else:
            fn = torch.compile(lambda m=model: F.cross_entropy(m(x).flatten(0, 1).float(), y.flatten()))

        def step(fn=fn, model=model):
            loss = fn()
            loss.backward()
            for q in model.parameters():
                q.grad = None

        models[name], steps[name] = model, step
        t = time.perf_counter()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        print(f"{name}: compiled and warmed in {time.perf_counter() - t:.1f} s", flush=True)
    timed = measure_interleaved(steps, warmup=0, repeats=args.steps, device="cuda")  # warmed above
    times = {name: [s * 1e3 for s in t.samples_s] for name, t in timed.items()}
    result = {"layers": args.layers, "batch": args.batch, "seq": args.seq, "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "rows": {}}
    for name, step in steps.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        kernels = defaultdict(float)
        for ev in prof.key_averages():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                kernels[ev.key] += ev.device_time_total / 3 / 1e3  # ms per step
        top = sorted(kernels.items(), key=lambda kv: -kv[1])[:25]
        result["rows"][name] = {"step_ms_median": statistics.median(times[name]), "step_ms": times[name],
                                "kernel_ms_per_step": sum(kernels.values()),
                                "top_kernels_ms_per_step": {k: round(v, 4) for k, v in top}}
        print(f"\n{name}: median {statistics.median(times[name]):.2f} ms/step, kernels {sum(kernels.values()):.2f} ms")
        for k, v in top[:14]:
            print(f"  {v:8.3f} ms  {k[:110]}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rope_probe.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
