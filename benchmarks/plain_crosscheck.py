"""A plain training loop written without kiln, to check `kiln bench compile --baseline plain` from outside.

Imports torch (and timm for the ViT) only. Same settings as the bench's plain row on its presets:

- `mlp`: the seed MLP (24 x [Linear(1024) -> LayerNorm -> GELU -> Dropout(0.1)], then
  Linear(1024, 512) -> ReLU -> Linear(512, 1000)), batch 128 of random features, fp32 with TF32
  matmuls allowed (kiln's precision.tf32 default), AdamW(lr 1e-3, weight decay 0.01, fused),
  cosine LR schedule over 200 steps, no warm-up (preset seed000-levels);
- `vit`: timm `vit_base_patch16_224`, batch 64 of random images, bf16 autocast, AdamW(lr 1e-3,
  weight decay 0.05, fused), the same schedule (preset seed001-vit with `--model timm:...`).
The model is compiled as a user compiles it: `torch.compile(model, mode=MODE)`. Each clip value in
`--clip` (0: no clipping, else clip_grad_norm_ to it) gets a fresh model, optimizer and schedule.

Timing as the bench does it, in its order: the first step (compiles) and `--warmup` steps of each
loop untimed, then `--steps` samples each bracketed by a device synchronize; the figure is the
median. Two ways, in this order:
- `interleaved`: each compiled step alternates with one step of an eager twin (same settings,
  uncompiled), as `kiln bench compile` alternates every recipe with its eager baseline; with
  `--fp32-twin` an eager fp32 twin follows in each round, as the bench's fp32 reference does for a
  bf16 row;
- `alone`: after one more step, the compiled loop's steps back to back (what a user's script measures).

    python benchmarks/plain_crosscheck.py --model mlp --mode reduce-overhead --clip 0,1 --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

TOTAL_STEPS = 200
SHAPES = {
    "mlp": {"batch": 128, "lr": 1e-3, "weight_decay": 0.01, "precision": "fp32"},
    "vit": {"batch": 64, "lr": 1e-3, "weight_decay": 0.05, "precision": "bf16-mixed"},
}


class Block(nn.Module):
    def __init__(self, h: int, p: float):
        super().__init__()
        self.linear, self.norm, self.act, self.drop = nn.Linear(h, h), nn.LayerNorm(h), nn.GELU(), nn.Dropout(p)

    def forward(self, x):
        return self.drop(self.act(self.norm(self.linear(x))))


class SeedMLP(nn.Module):
    def __init__(self, h: int = 1024, layers: int = 24, classes: int = 1000, p: float = 0.1):
        super().__init__()
        self.backbone = nn.Sequential(*(Block(h, p) for _ in range(layers)))
        self.head = nn.Sequential(nn.Linear(h, h // 2), nn.ReLU(), nn.Linear(h // 2, classes))

    def forward(self, x):
        return self.head(self.backbone(x))


def build(model: str, device: torch.device, batch: int | None = None, width: int = 1024, depth: int = 24):
    """(model, batches) for a model name: two fixed batches on the device (`batch`, and the MLP's
    `width` and `depth`, default to the preset's shapes; smaller ones make a CPU smoke run)."""
    torch.manual_seed(0)
    b = batch or SHAPES[model]["batch"]
    if model == "mlp":
        net = SeedMLP(width, depth)
        batches = [(torch.randn(b, width), torch.randint(0, 1000, (b,))) for _ in range(2)]
    else:
        import timm

        net = timm.create_model("vit_base_patch16_224", num_classes=1000)
        batches = [(torch.randn(b, 3, 224, 224), torch.randint(0, 1000, (b,))) for _ in range(2)]
    return net.to(device).train(), [(x.to(device), y.to(device)) for x, y in batches]


def make_step(model_name: str, net: nn.Module, clip: float, mode: str | None, device: torch.device,
              precision: str | None = None):
    """One optimizer step of the plain loop (a closure over its model, optimizer and schedule);
    `precision` overrides the model's (fp32: the bench's eager fp32 reference)."""
    s = SHAPES[model_name]
    model = torch.compile(net, mode=mode) if mode else net
    opt = torch.optim.AdamW(net.parameters(), lr=s["lr"], weight_decay=s["weight_decay"], fused=device.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5 * (1 + math.cos(math.pi * min(1.0, k / TOTAL_STEPS))))
    bf16 = (precision or s["precision"]) == "bf16-mixed"

    def step(x, y):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        return loss

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def run_clip(model_name: str, clip: float, mode: str | None, warmup: int, steps: int, device: torch.device,
             fp32_twin: bool = False, **shape) -> dict:
    """One clip value, timed in the bench's order: the compiled loop and its eager twin(s) warmed
    up, `steps` rounds interleaved (eager, compiled[, eager fp32]), then `steps` compiled steps back
    to back after one more warm-up step."""
    net, batches = build(model_name, device, **shape)
    step = make_step(model_name, net, clip, mode, device)
    twin, _ = build(model_name, device, **shape)
    eager_step = make_step(model_name, twin, clip, None, device)
    sides = {"eager": eager_step, "compiled": step}
    if fp32_twin:  # the bench's speedup_vs_eager_fp32 reference, timed in every round of a bf16 row
        ref, _ = build(model_name, device, **shape)
        sides["eager_fp32"] = make_step(model_name, ref, clip, None, device,
                                        precision="fp32")
    cursors = {name: [0] for name in sides}

    def one(name):
        x, y = batches[cursors[name][0] % len(batches)]
        cursors[name][0] += 1
        sides[name](x, y)

    first_s = timed(lambda: one("compiled"), device)
    for name in sides:
        for _ in range(warmup):
            one(name)
    samples = {name: [] for name in sides}
    for _ in range(steps):
        for name in sides:
            samples[name].append(timed(lambda n=name: one(n), device))
    one("compiled")
    alone = [timed(lambda: one("compiled"), device) for _ in range(steps)]
    sides.clear()  # the models go with their steps
    del net, twin
    if device.type == "cuda":
        torch.cuda.empty_cache()
    ms = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    run = {"grad_clip": clip, "first_step_s": first_s, "step_ms_alone": ms(alone),
           "step_ms_interleaved": ms(samples["compiled"]), "eager_step_ms_interleaved": ms(samples["eager"]),
           "alone_p10_p90_ms": [sorted(alone)[len(alone) // 10] * 1e3, sorted(alone)[(9 * len(alone)) // 10] * 1e3]}
    if fp32_twin:
        run["eager_fp32_step_ms_interleaved"] = ms(samples["eager_fp32"])
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=tuple(SHAPES), required=True)
    p.add_argument("--mode", default="reduce-overhead",
                   help="torch.compile mode (default reduce-overhead); none: not compiled (a CPU smoke run)")
    p.add_argument("--clip", default="0,1", help="comma-separated grad clip values; 0 = no clipping (default 0,1)")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, help="override the preset's batch size (a CPU smoke run)")
    p.add_argument("--fp32-twin", action="store_true",
                   help="also interleave an eager fp32 twin after each compiled step, as `kiln bench compile` "
                        "times its speedup_vs_eager_fp32 reference in every round of a bf16 row")
    p.add_argument("--mlp-width", type=int, default=1024, help="seed MLP width (default 1024, the preset's)")
    p.add_argument("--mlp-depth", type=int, default=24, help="seed MLP blocks (default 24, the preset's)")
    p.add_argument("--out", type=Path, required=True, help="directory for crosscheck_<model>.json")
    p.add_argument("--append", action="store_true",
                   help="add this call's runs to an existing crosscheck_<model>.json (one process per clip value, "
                        "as a user's script trains one model: on an H100 the seed MLP's clip value run second in "
                        "a process read 19-24 %% slower than the same value run first in another)")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_float32_matmul_precision("high")  # TF32 for fp32 matmuls, as kiln's precision.tf32=true
    s = SHAPES[args.model]
    result = {"model": args.model, "mode": args.mode, "device": torch.cuda.get_device_name(device)
              if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "settings": {**s, "batch": args.batch or s["batch"],
                           **({"mlp_width": args.mlp_width, "mlp_depth": args.mlp_depth} if args.model == "mlp" else {}),
                           "optimizer": "adamw (fused on CUDA)", "schedule": "cosine", "warmup_steps": 0,
                           "total_steps": TOTAL_STEPS, "tf32": True, "warmup": args.warmup, "steps": args.steps,
                           "fp32_twin": args.fp32_twin},
              "runs": []}
    for clip in (float(c) for c in args.clip.split(",")):
        run = run_clip(args.model, clip, None if args.mode == "none" else args.mode, args.warmup, args.steps, device,
                       fp32_twin=args.fp32_twin, batch=args.batch, width=args.mlp_width, depth=args.mlp_depth)
        print(f"{args.model} {args.mode} clip {clip:g}: alone {run['step_ms_alone']:.3f} ms, interleaved with eager "
              f"{run['step_ms_interleaved']:.3f} ms (eager {run['eager_step_ms_interleaved']:.3f} ms)", flush=True)
        result["runs"].append(run)
        torch._dynamo.reset()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"crosscheck_{args.model}.json"
    if args.append and path.is_file():
        earlier = json.loads(path.read_text())
        result["runs"] = earlier["runs"] + result["runs"]
    path.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    code = main()
    # The JSON is written: skip the interpreter's teardown, where inductor's compile-worker pool can
    # take many seconds to shut down (the first run of each model in an H100 call outlived
    # evidence.sh's time box there, after its figures were printed and saved).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
