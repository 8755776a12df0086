"""Host (Python/dispatch) cost of kiln's DDP and FSDP2 wrappers, measured at one rank.

    python benchmarks/fsdp_host_overhead.py --out DIR [--repeats 30]
    python benchmarks/fsdp_host_overhead.py --out DIR --device cuda --config configs/vit_b16.toml

On CPU (gloo; the default case below) or, with `--device cuda` (NCCL) and a `--config` such as
ViT-B/16's, on one GPU, where a step whose host work exceeds the GPU's own time waits for it.

The default case: a 12-block ViT with tiny widths (embed 32, 32x32 images, batch 2), so the
arithmetic is negligible and each step's time is what the wrappers, hooks, compiled-region entries
and optimizer cost on the host: the part of a step that a GPU cannot hide once it exceeds the GPU's
own time. Every variant is built the way `kiln train` builds it (kiln.train.assemble.
build_train_step, compiled, fused AdamW), all in one process and timed interleaved
(kiln.timing.measure_interleaved), so machine load hits all alike. The tiny blocks would all
fit one >= 64 MiB unit, so the FSDP2 variants name their units: `fsdp-unit3` (3 blocks per unit,
resharded after forward) is kiln's previous default layout on ViT-B/16 and `fsdp-unit6-auto` (2
units of 6, reshard `auto`, which keeps both models gathered) today's. `fsdp-before` is the layout
before the scaling work (one unit per block, every block resharded, the optimizer update through
DTensor dispatch; `fsdp-dtensor-update` puts only that update back), `none-per-block` compiles the
12 blocks one by one without a wrapper (FSDP2's compile layout: what 12 compiled regions cost).
The FSDP2 variants fill the gathered parameters with kiln's one-rank fused copy
(kiln.distributed.fsdp_one_rank); the `-torch-copy` ones with torch's copy per parameter. `--variants`
times a subset (`none` always, as the base).

The `ddp` row is not the DDP step `kiln train` runs: built in this process after `none`, the
wrapped model's forward reuses the graph dynamo compiled for `none` (dynamo starts inside
DDP.forward, and DDPOptimizer splits a graph at buckets only when it compiles one), so it times
DDP's hooks around one unsplit graph. `kiln bench scale` (one torchrun job per point) measures DDP
as trained.

A second table times each step's phases per variant (interleaved; backward is the step less the
timed phases), a third FSDP2's own hooks (torch's functions wrapped with timers, exclusive time)
for the two default layouts, a fourth the update's parts alone on the `fsdp-unit3` model's
gradients, interleaved: gradient clipping through torch's `clip_grad_norm_` (DTensor dispatch) and
kiln's local-shard clipping, fused AdamW through torch's DTensor path and kiln's ShardLocalAdamW
(each optimizer its own instance over the same parameters), and the `set_requires_gradient_sync`
call that kiln made every step before it called it only on a change. Writes
DIR/results.json and results.md.
"""

from __future__ import annotations

import argparse
import collections
import os
import shlex
import statistics
import sys
import time

import torch
import torch.distributed as dist

import kiln.distributed.apply as apply_mod
import kiln.distributed.fsdp as fsdp_mod
from kiln.bench.results import write_results
from kiln.config import load_config
from kiln.data import build_data
from kiln.distributed.local_optim import ShardLocalAdamW
from kiln.distributed.sharded_norm import clip_grad_norm
from kiln.models import build_model
from kiln.monitor.env import collect_env
from kiln.precision import apply_precision, resolve_precision
from kiln.timing import measure_interleaved
from kiln.train.assemble import build_train_step

BASE = ["model.name=vit", "model.kwargs.img_size=32", "model.kwargs.patch_size=8", "model.kwargs.embed_dim=32",
        "model.kwargs.depth=12", "model.kwargs.num_heads=2", "model.kwargs.num_classes=10", "data.batch_size=2",
        "training.device=cpu", "compile.enabled=true", "optim.fused=true"]
RESHARD, KEEP = "distributed.fsdp_reshard_after_forward=true", "distributed.fsdp_reshard_after_forward=false"
TORCH_COPY = "distributed.fsdp_one_rank_fused_copy=false"
VARIANTS = {
    "none": ("none", []),
    "none-per-block": ("none", ["compile.regional=true"]),
    "ddp": ("ddp", []),
    "fsdp-before": ("fsdp", ["distributed.fsdp_unit_blocks=1", "distributed.fsdp_local_update=false"]),
    "fsdp-dtensor-update": ("fsdp", ["distributed.fsdp_unit_blocks=3", RESHARD, "distributed.fsdp_local_update=false"]),
    "fsdp-unit1": ("fsdp", ["distributed.fsdp_unit_blocks=1", RESHARD]),
    "fsdp-unit3": ("fsdp", ["distributed.fsdp_unit_blocks=3", RESHARD]),
    "fsdp-unit3-torch-copy": ("fsdp", ["distributed.fsdp_unit_blocks=3", RESHARD, TORCH_COPY]),
    "fsdp-whole": ("fsdp", ["distributed.fsdp_unit_blocks=3", RESHARD, "distributed.compile_strategy=whole"]),
    "fsdp-zero2": ("fsdp", ["distributed.fsdp_unit_blocks=3", KEEP]),
    "fsdp-unit6": ("fsdp", ["distributed.fsdp_unit_blocks=6", RESHARD]),
    "fsdp-unit6-auto": ("fsdp", ["distributed.fsdp_unit_blocks=6"]),
    "fsdp-unit6-auto-torch-copy": ("fsdp", ["distributed.fsdp_unit_blocks=6", TORCH_COPY]),
    "fsdp-unit12": ("fsdp", ["distributed.fsdp_unit_blocks=12"]),
}
# The previous and today's default layouts on ViT-B/16, today's with torch's one-rank copy.
HOOKED = ("fsdp-unit3", "fsdp-unit6-auto", "fsdp-unit6-auto-torch-copy")
PHASES = ("forward", "backward", "clip", "optimizer", "zero_grad", "lr_schedule")


def _build(name: str, config: str | None, device: torch.device):
    strategy, extra = VARIANTS[name]
    base = BASE if config is None else [f"training.device={device.type}"]
    cfg = load_config(config, [*base, *extra, f"distributed.strategy={strategy}"])
    policy = resolve_precision(cfg.precision.policy, device)
    torch.manual_seed(0)
    built = build_model(cfg.model)
    model = apply_precision(built.module.to(device), policy)
    batch = tuple(t.to(device) for t in next(iter(build_data(cfg.data, built.input_spec, device=device, seed=0))))
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
    step.bench_batch = batch
    return (lambda: step([batch])), time.perf_counter() - started, step


def _timed(fn, rec: collections.Counter, key: str):
    def call(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            rec[key] += time.perf_counter() - started

    return call


def _phases(steps: dict, repeats: int, calls: int, device: torch.device) -> list[dict]:
    """Each step's phases (host time, ms per step), interleaved; timers go in after the main table.
    On a GPU `step` is the wall time of the sample (synchronized); the phases stay host time."""
    recs = {}
    for name, step in steps.items():
        rec = recs[name] = collections.Counter()
        step._loss_fn = _timed(step._loss_fn, rec, "forward")
        step._norm_fn = _timed(step._norm_fn, rec, "clip")
        step._apply = _timed(step._apply, rec, "optimizer")
        step.optimizer.zero_grad = _timed(step.optimizer.zero_grad, rec, "zero_grad")
        step.scheduler.step = _timed(step.scheduler.step, rec, "lr_schedule")
    samples = {name: collections.defaultdict(list) for name in steps}
    for r in range(repeats + 3):
        for name, step in steps.items():
            rec = recs[name]
            rec.clear()
            started = time.perf_counter()
            for _ in range(calls):
                step([step.bench_batch])
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            total = time.perf_counter() - started
            rec["backward"] = total - sum(rec.values())  # the rest: backward, loss scaling, the step's own glue
            if r >= 3:
                samples[name]["step"].append(total)
                for key in PHASES:
                    samples[name][key].append(rec[key])
    rows = []
    for name, got in samples.items():
        row = {"status": "ok", "variant": name}
        row.update({key: statistics.median(got[key]) / calls * 1e3 for key in ("step", *PHASES)})
        rows.append(row)
        print(f"{name:22s} " + " ".join(f"{k} {row[k]:.2f}" for k in ("step", *PHASES)))
    return rows


def _fsdp_hooks(steps: dict, calls: int, device: torch.device) -> list[dict]:
    """FSDP2's own host time per step, by function (exclusive of the timed functions it calls).
    Wraps torch internals that are looked up at call time; names missing in a torch are skipped."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group_mod
    from torch.distributed.fsdp._fully_shard import _fsdp_state as state_mod

    from kiln.distributed.fsdp_one_rank import fsdp_param_groups

    spent, count, stack = collections.Counter(), collections.Counter(), []

    def wrap(owner, attr: str) -> None:
        fn = getattr(owner, attr, None)
        if fn is None:
            return

        def call(*args, **kwargs):
            started = time.perf_counter()
            stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                took, inner = time.perf_counter() - started, stack.pop()
                spent[attr] += took - inner
                count[attr] += 1
                if stack:
                    stack[-1] += took

        setattr(owner, attr, call)
        undo.append((owner, attr, fn))

    undo: list = []
    for attr in ("pre_forward", "post_forward", "pre_backward", "post_backward", "unshard", "wait_for_unshard",
                 "reshard", "_register_post_backward_hook"):
        wrap(group_mod.FSDPParamGroup, attr)
    for attr in ("_root_pre_forward", "_cast_forward_inputs", "_pre_backward", "_register_pre_backward_hook",
                 "_root_post_backward_final_callback"):
        wrap(state_mod.FSDPState, attr)
    wrap(group_mod, "foreach_reduce")
    for step in steps.values():  # kiln's one-rank fused copy: each group's own wait_for_unshard
        for group in fsdp_param_groups(step.model):
            if "wait_for_unshard" in vars(group):
                wrap(group, "wait_for_unshard")
    rows = []
    try:
        for name, step in steps.items():
            for _ in range(3):
                step([step.bench_batch])
            spent.clear()
            count.clear()
            n = 25 * calls
            started = time.perf_counter()
            for _ in range(n):
                step([step.bench_batch])
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            total = (time.perf_counter() - started) / n * 1e3
            print(f"== {name}: {total:.2f} ms per step with the timers")
            for attr, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
                rows.append({"status": "ok", "variant": name, "function": attr, "ms": seconds / n * 1e3,
                             "calls": count[attr] / n, "step_ms": total})
                print(f"   {attr:36s} {seconds / n * 1e3:7.3f} ms  {count[attr] / n:5.1f} calls")
            rows.append({"status": "ok", "variant": name, "function": "(all of the above)",
                         "ms": sum(spent.values()) / n * 1e3, "calls": None, "step_ms": total})
    finally:
        for owner, attr, fn in reversed(undo):
            setattr(owner, attr, fn)
    return rows


def _update_parts(step, repeats: int, calls: int, device: torch.device) -> list[dict]:
    """The update's parts alone, on gradients left in place (values drift; the work does not)."""
    params = step.params
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    parts = {
        "clip: torch clip_grad_norm_ (DTensor)": lambda: torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True),
        "clip: kiln local shards": lambda: clip_grad_norm(params, 1.0),
        "adamw fused: torch (DTensor)": torch.optim.AdamW(params, lr=1e-6, fused=True).step,
        "adamw fused: kiln ShardLocalAdamW": ShardLocalAdamW(params, lr=1e-6, fused=True).step,
        "set_requires_gradient_sync(True) (kiln called it every step before)":
            lambda: step.model.set_requires_gradient_sync(True),
    }
    times = measure_interleaved(parts, warmup=3, repeats=repeats, calls_per_sample=calls, device=device)
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
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--config", default=None, help="a kiln config in place of the tiny ViT (e.g. configs/vit_b16.toml)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated variants to time (`none`, the base, always); default all")
    args = ap.parse_args(argv)
    chosen = ["none", *(v for v in dict.fromkeys(args.variants.split(",")) if v and v != "none")]
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    else:
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo" if device.type == "cpu" else "nccl", rank=0, world_size=1)
    fns, first, steps = {}, {}, {}
    for name in chosen:
        fns[name], first[name], steps[name] = _build(name, args.config, device)
        print(f"built {name} (first step {first[name]:.1f} s)", flush=True)
    times = measure_interleaved(fns, warmup=5, repeats=args.repeats, calls_per_sample=args.calls, device=device)
    base = times["none"].median_s
    rows = []
    for name, t in times.items():
        ms = t.as_dict(per=args.calls)
        rows.append({"status": "ok", "variant": name, "strategy": VARIANTS[name][0],
                     "overrides": " ".join(VARIANTS[name][1]), "step_ms": ms["median_ms"], "step_ms_p10": ms["p10_ms"],
                     "step_ms_p90": ms["p90_ms"], "vs_none": t.median_s / base,
                     "host_overhead_ms": (t.median_s - base) / args.calls * 1e3, "first_step_s": first[name]})
        print(f"{name:22s} {ms['median_ms']:7.2f} ms  x{t.median_s / base:.2f}")
    phases = _phases(steps, args.repeats, args.calls, device)
    hooks = _fsdp_hooks({name: steps[name] for name in HOOKED if name in steps}, args.calls, device)
    parts = _update_parts(steps["fsdp-unit3"], args.repeats, args.calls, device) if "fsdp-unit3" in steps else []
    dist.destroy_process_group()
    step_cols = ["variant", "strategy", "overrides", "step_ms", "step_ms_p10", "step_ms_p90", "vs_none",
                 "host_overhead_ms", "first_step_s", "status"]
    case = "CPU, one gloo rank, tiny 12-block ViT" if args.config is None else f"{device.type}, one rank, {args.config}"
    write_results(args.out, env=collect_env(), config={"base": BASE if args.config is None else args.config,
                                                        "device": args.device,
                                                        "variants": {name: VARIANTS[name] for name in chosen},
                                                        "repeats": args.repeats, "calls_per_sample": args.calls},
                  results=rows + phases + hooks + parts, command="python " + shlex.join(sys.argv),
                  title=f"Host cost of the wrappers ({case}, compiled)", columns=step_cols,
                  sections=[("Training step per variant (interleaved)", rows, step_cols),
                            ("Host time per phase, ms per step (interleaved medians; backward = the rest)", phases,
                             ["variant", "step", *PHASES]),
                            ("FSDP2's own functions, ms per step (exclusive, timers on)", hooks,
                             ["variant", "function", "ms", "calls", "step_ms"]),
                            ("The update's parts alone, FSDP2 fsdp-unit3 gradients (interleaved)", parts,
                             ["part", "ms", "ms_p10", "ms_p90", "parameters", "status"])])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
