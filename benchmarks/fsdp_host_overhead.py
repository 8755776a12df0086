"""Host (Python/dispatch) cost of kiln's DDP and FSDP2 wrappers, measured on CPU at one gloo rank.

    python benchmarks/fsdp_host_overhead.py --out DIR [--repeats 30]

A 12-block ViT with tiny widths (embed 32, 32x32 images, batch 2), so the arithmetic is negligible
and each step's time is what the wrappers, hooks, compiled-region entries and optimizer cost on the
host: the part of a step that a GPU cannot hide once it exceeds the GPU's own time. Every variant is
built the way `kiln train` builds it (kiln.train.assemble.build_train_step, compiled, fused AdamW),
all in one process and timed interleaved (kiln.bench.timing.measure_interleaved), so machine load
hits all alike. `fsdp-before` is kiln's FSDP2 layout before the scaling work: one unit per block,
every block resharded after forward, the optimizer update through DTensor dispatch (now the last
unit stays gathered, blocks are grouped into units of >= 32 MiB and the update runs on the local
shards, kiln.distributed.local_optim); `fsdp-dtensor-update` is today's layout with only the
update put back on the DTensor path. A second table times the update's parts alone on the
`fsdp-unit3` model's gradients, interleaved: gradient clipping through torch's `clip_grad_norm_`
(DTensor dispatch) and kiln's local-shard clipping, and fused AdamW through torch's DTensor path and
kiln's ShardLocalAdamW (each optimizer its own instance over the same parameters). Writes
DIR/results.json and results.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

import torch
import torch.distributed as dist

import kiln.distributed.apply as apply_mod
import kiln.distributed.fsdp as fsdp_mod
from kiln.bench.results import write_results
from kiln.bench.timing import measure_interleaved
from kiln.config import load_config
from kiln.data import build_data
from kiln.distributed.local_optim import ShardLocalAdamW
from kiln.distributed.sharded_norm import clip_grad_norm
from kiln.models import build_model
from kiln.monitor.env import collect_env
from kiln.precision import apply_precision, resolve_precision
from kiln.train.assemble import build_train_step

BASE = ["model.name=vit", "model.kwargs.img_size=32", "model.kwargs.patch_size=8", "model.kwargs.embed_dim=32",
        "model.kwargs.depth=12", "model.kwargs.num_heads=2", "model.kwargs.num_classes=10", "data.batch_size=2",
        "training.device=cpu", "compile.enabled=true", "optim.fused=true"]
VARIANTS = {
    "none": ("none", []),
    "ddp": ("ddp", []),
    "fsdp-before": ("fsdp", ["distributed.fsdp_unit_blocks=1", "distributed.fsdp_local_update=false"]),
    "fsdp-dtensor-update": ("fsdp", ["distributed.fsdp_unit_blocks=3", "distributed.fsdp_local_update=false"]),
    "fsdp-unit1": ("fsdp", ["distributed.fsdp_unit_blocks=1"]),
    "fsdp-unit3": ("fsdp", ["distributed.fsdp_unit_blocks=3"]),
    "fsdp-unit12": ("fsdp", ["distributed.fsdp_unit_blocks=12"]),
    "fsdp-zero2": ("fsdp", ["distributed.fsdp_unit_blocks=3", "distributed.fsdp_reshard_after_forward=false"]),
    "fsdp-whole": ("fsdp", ["distributed.fsdp_unit_blocks=3", "distributed.compile_strategy=whole"]),
}


def _build(name: str):
    strategy, extra = VARIANTS[name]
    cfg = load_config(None, [*BASE, *extra, f"distributed.strategy={strategy}"])
    device = torch.device("cpu")
    policy = resolve_precision(cfg.precision.policy, device)
    torch.manual_seed(0)
    built = build_model(cfg.model)
    model = apply_precision(built.module, policy)
    batch = next(iter(build_data(cfg.data, built.input_spec, device=device, seed=0)))
    saved = apply_mod.apply_fsdp
    if name == "fsdp-before":

        def apply_fsdp_all_resharded(model, blocks, dcfg, pol):
            from torch.distributed.fsdp import fully_shard

            mp = fsdp_mod.mixed_precision(dcfg, pol)
            for block in blocks:
                fully_shard(block, mp_policy=mp, reshard_after_forward=True)
            return fully_shard(model, mp_policy=mp, reshard_after_forward=False)

        apply_mod.apply_fsdp = apply_fsdp_all_resharded
    try:
        step = build_train_step(model, built.task, built.blocks, cfg, policy, device, strategy=strategy)
    finally:
        apply_mod.apply_fsdp = saved
    started = time.perf_counter()
    step([batch])
    return (lambda: step([batch])), time.perf_counter() - started, step


def _update_parts(step, repeats: int, calls: int) -> list[dict]:
    """The update's parts alone, on gradients left in place (values drift; the work does not)."""
    params = step.params
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    parts = {
        "clip: torch clip_grad_norm_ (DTensor)": lambda: torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True),
        "clip: kiln local shards": lambda: clip_grad_norm(params, 1.0),
        "adamw fused: torch (DTensor)": torch.optim.AdamW(params, lr=1e-6, fused=True).step,
        "adamw fused: kiln ShardLocalAdamW": ShardLocalAdamW(params, lr=1e-6, fused=True).step,
    }
    times = measure_interleaved(parts, warmup=3, repeats=repeats, calls_per_sample=calls, device="cpu")
    rows = []
    for name, t in times.items():
        ms = t.as_dict(per=calls)
        rows.append({"status": "ok", "part": name, "ms": ms["median_ms"], "ms_p10": ms["p10_ms"], "ms_p90": ms["p90_ms"],
                     "parameters": len(params)})
        print(f"{name:36s} {ms['median_ms']:7.3f} ms")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--calls", type=int, default=4, help="steps per timed sample")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1)
    fns, first, steps = {}, {}, {}
    for name in VARIANTS:
        fns[name], first[name], steps[name] = _build(name)
        print(f"built {name} (first step {first[name]:.1f} s)", flush=True)
    times = measure_interleaved(fns, warmup=5, repeats=args.repeats, calls_per_sample=args.calls, device="cpu")
    base = times["none"].median_s
    rows = []
    for name, t in times.items():
        ms = t.as_dict(per=args.calls)
        rows.append({"status": "ok", "variant": name, "strategy": VARIANTS[name][0],
                     "overrides": " ".join(VARIANTS[name][1]), "step_ms": ms["median_ms"], "step_ms_p10": ms["p10_ms"],
                     "step_ms_p90": ms["p90_ms"], "vs_none": t.median_s / base,
                     "host_overhead_ms": (t.median_s - base) / args.calls * 1e3, "first_step_s": first[name]})
        print(f"{name:22s} {ms['median_ms']:7.2f} ms  x{t.median_s / base:.2f}")
    parts = _update_parts(steps["fsdp-unit3"], args.repeats, args.calls)
    dist.destroy_process_group()
    step_cols = ["variant", "strategy", "overrides", "step_ms", "step_ms_p10", "step_ms_p90", "vs_none",
                 "host_overhead_ms", "first_step_s", "status"]
    write_results(args.out, env=collect_env(), config={"base": BASE, "variants": VARIANTS, "repeats": args.repeats,
                                                        "calls_per_sample": args.calls},
                  results=rows + parts, command="python " + shlex.join(sys.argv),
                  title="Host cost of the wrappers (CPU, one gloo rank, tiny 12-block ViT, compiled)", columns=step_cols,
                  sections=[("Training step per variant (interleaved)", rows, step_cols),
                            ("The update's parts alone, FSDP2 fsdp-unit3 gradients (interleaved)", parts,
                             ["part", "ms", "ms_p10", "ms_p90", "parameters", "status"])])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
