"""Microbenchmark of a decode step's projections at several batch sizes (rows) on a GPU, per
projection of a model's shape, each with the work the model fuses around it (RMSNorm before wqkv,
w_gate_up and lm_head; SwiGLU before w_down; the residual add after wo and w_down):

- `cublas`: `F.linear` alone (no fused work), the library's skinny GEMM;
- `matvec`: kiln.kernels.triton_matvec, the one-row kernel (programs per row), rows <= its MAX_ROWS;
- `skinny`: kiln.kernels.triton_skinny, the dense row kernel (one weight read for all rows, split K,
  `tl.dot`), at its table's setting where it holds the shape, else its rule's;
- with `--int4`, group 128: `int4 matvec` (kiln.kernels.triton_int4, per row) and `int4 rows`
  (kiln.kernels.triton_rows, one weight read for all rows, `tl.dot`).
With `--sweep`, also every launch setting of the int4 row kernel (`int4 rows BN/SPLIT`), each in its
own CUDA graph: the settings the autotuner chooses from, timed as the model runs them. With
`--sweep-skinny R`, every launch setting of `skinny` (`skinny BN/BK/SPLIT/warps/stages`) at the row
counts R (its row tiles: 16, 32, 64); its best per (row tile, N, K) is what kiln.kernels.triton_skinny's
table holds. `--prepare-only --shard I/N` only compiles shard I of N of the variants (Triton's cache on
disk then serves the timed run): N such processes at once cut the sweep's compile time.

Each variant is captured as back-to-back calls cycling over enough weight copies to miss L2, in one
CUDA graph, replayed `--repeats` times with variants interleaved; figures are the median us per call
and GB/s of the weight bytes (the bytes a step must read whatever its batch). Outputs are checked
against an fp32 computation of the same math. The autotuner's choices are kept in results.json.

    python benchmarks/rows_bench.py --out DIR [--model llama-3.2-3b] [--rows 1,2,4,8,16,32,64] [--int4]
        [--sweep-skinny 16,32,64] [--prepare-only --shard I/N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kiln.bench.formulas import int4_weight_bytes
from kiln.llm.config import resolve_model
from kiln.timing import cuda_graph_of, replay_rounds

sys.path.insert(0, str(Path(__file__).parent))
from matvec_bench import L2_BYTES, eager, projections  # noqa: E402  (the same shapes and reference math)

SKINNY_SWEEP = [(bn, bk, split, 4, stages) for bn, bk in ((32, 256), (64, 64), (64, 128), (64, 256), (128, 64), (128, 128))
                for split in (1, 2, 4, 8) for stages in (3, 4)]
"""(BLOCK_N, BLOCK_K, SPLIT, warps, stages) of the dense row kernel that `--sweep-skinny` times."""
SMEM_BYTES = 200 * 1024


def skinny_sweep(rows: int, out_f: int, in_f: int, sms: int) -> list[str]:
    """The swept settings that fit an H100's shared memory, leave every split two K tiles, and launch
    between half an SM's worth and 16 programs per SM (one split only past that)."""
    from kiln.kernels.triton_rows import block_m

    kept = []
    for bn, bk, split, warps, stages in SKINNY_SWEEP:
        programs = -(-out_f // bn) * split
        if stages * (bn + block_m(rows)) * bk * 2 > SMEM_BYTES or in_f // split < 2 * bk:
            continue
        if programs < sms // 2 or (programs > 16 * sms and split > 1):
            continue
        kept.append(f"skinny {bn}/{bk}/{split}/{warps}/{stages}")
    return kept


def variants_for(rows: int, int4: bool, sweep: bool) -> list[str]:
    from kiln.kernels.triton_matvec import MAX_ROWS
    from kiln.kernels.triton_rows import SWEEP_SETTINGS
    from kiln.kernels.triton_skinny import MAX_ROWS as SKINNY_ROWS

    names = ["cublas"] + (["matvec"] if rows <= MAX_ROWS else []) + (["skinny"] if rows <= SKINNY_ROWS else [])
    if int4:
        names += ["int4 rows"] + (["int4 matvec"] if rows <= MAX_ROWS else [])
        if sweep:
            names += [f"int4 rows {bn}/{split}" for bn, split in SWEEP_SETTINGS]
    return names


def swept_setting(variant: str) -> list[int] | None:
    """The launch setting a swept variant names (`int4 rows 64/2` -> [64, 2]), else None."""
    tail = variant.rsplit(" ", 1)[-1]
    return [int(v) for v in tail.split("/")] if "/" in tail else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-3.2-3b")
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--int4", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="also every launch setting of the int4 row kernel")
    ap.add_argument("--sweep-skinny", default="", help="rows at which every launch setting of `skinny` is timed")
    ap.add_argument("--prepare-only", action="store_true", help="compile this shard's variants, time nothing")
    ap.add_argument("--shard", default="0/1", help="I/N: with --prepare-only, the I-th of N shares of the variants")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="prepare no new (projection, rows) case after this many seconds; time and write what is ready")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("rows_bench: needs a CUDA device", file=sys.stderr)
        return 2
    from kiln.kernels import triton_int4, triton_matvec, triton_rows, triton_skinny  # noqa: F401  (registers the ops)
    from kiln.llm.int4_layout import Int4TritonLinear

    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    config = resolve_model(args.model).config
    eps = config.norm_eps
    row_counts = [int(r) for r in args.rows.split(",")]
    sweep_skinny = {int(r) for r in args.sweep_skinny.split(",") if r}
    shard, shards = (int(v) for v in args.shard.split("/"))
    sms, counter = torch.cuda.get_device_properties(dev).multi_processor_count, 0
    graphs, meta, alive = {}, {}, []
    started, skipped = time.perf_counter(), []
    for name, out_f, in_f, prologue, residual in projections(config):
        wbytes = out_f * in_f * 2
        copies = 1 if args.prepare_only else max(2, min(args.calls, -(-3 * L2_BYTES // wbytes)))
        ws = [torch.randn(out_f, in_f, device=dev, dtype=dt) / in_f**0.5 for _ in range(copies)]
        norm_w = (torch.rand(in_f, device=dev, dtype=dt) + 0.5) if prologue == "rmsnorm" else None
        own = {}
        if args.int4:
            for w in ws:
                lin = nn.Linear(in_f, out_f, bias=False, device=dev, dtype=dt)
                lin.weight.data = w
                own[w.data_ptr()] = Int4TritonLinear.from_linear(lin, 128)
        alive.append((ws, norm_w, own))
        for m in row_counts:
            if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
                skipped.append(f"{name} rows={m}")
                continue
            x = torch.randn(m, 2 * in_f if prologue == "silu_mul" else in_f, device=dev, dtype=dt)
            res = torch.randn(m, out_f, device=dev, dtype=dt) if residual else None
            alive.append((x, res))
            exact = eager(prologue, x.float(), ws[0].float(), None if norm_w is None else norm_w.float(),
                          None if res is None else res.float(), eps)
            fns = {
                "cublas": lambda w, x=x[:, :in_f]: F.linear(x, w),
                "matvec": lambda w, p=prologue, x=x, r=res, nw=norm_w: torch.ops.kiln.matvec(
                    x, w, None, nw, eps, p == "silu_mul", r),
                "skinny": lambda w, st=None, p=prologue, x=x, r=res, nw=norm_w: torch.ops.kiln.skinny(
                    x, w, None, nw, eps, p == "silu_mul", r, st),
            }
            if own:
                for variant, op in (("int4 matvec", torch.ops.kiln.int4_matvec), ("int4 rows", torch.ops.kiln.int4_rows)):
                    fns[variant] = lambda w, st=None, p=prologue, x=x, r=res, op=op, nw=norm_w, o=own: op(
                        x, o[w.data_ptr()].weight, o[w.data_ptr()].scale, o[w.data_ptr()].offset, 128, None,
                        nw, eps, "rmsnorm" if nw is not None else "silu_mul" if p == "silu_mul" else "none",
                        False, r, st)
            names = variants_for(m, bool(own), args.sweep)
            names += skinny_sweep(m, out_f, in_f, sms) if m in sweep_skinny else []
            for variant in names:
                base, setting = variant.rsplit(" ", 1)[0] if swept_setting(variant) else variant, swept_setting(variant)
                fn = fns[base] if setting is None else (
                    lambda w, f=fns[base], st=setting: f(w, st))
                counter += 1
                if args.prepare_only and counter % shards != shard:
                    continue
                try:
                    y = fn(ws[0])  # autotunes and compiles here, outside the graph
                    torch.cuda.synchronize()
                except Exception as exc:  # a setting this GPU cannot run (shared memory): skip it
                    skipped.append(f"{name} rows={m} {variant}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                if args.prepare_only:
                    continue
                err = None if variant == "cublas" else float((y.float() - exact).abs().max() / exact.abs().max())
                calls = [lambda fn=fn, w=w: fn(w) for w in ws]
                graphs[(name, m, variant)] = cuda_graph_of(lambda calls=calls: [c() for c in calls], 1)
                int4_bytes = int4_weight_bytes(out_f, in_f)
                meta[(name, m, variant)] = {"shape": [out_f, in_f], "prologue": prologue, "residual": residual,
                                            "weight_bytes": int4_bytes if variant.startswith("int4") else wbytes,
                                            "rel_err": err, "calls_per_replay": copies}
            print(f"{name} rows={m}: ready", flush=True)
    if args.prepare_only:
        print(f"prepared shard {shard}/{shards}; skipped: {skipped}")
        return 0
    times = {key: [ms * 1000 / meta[key]["calls_per_replay"] for ms in samples]
             for key, samples in replay_rounds(graphs, args.repeats).items()}
    results = []
    for (name, m, variant), samples in times.items():
        info = meta[(name, m, variant)]
        us = statistics.median(samples)
        results.append({"projection": name, "rows": m, "variant": variant, **info, "us_per_call": us,
                        "us_p10": statistics.quantiles(samples, n=10)[0], "us_p90": statistics.quantiles(samples, n=10)[-1],
                        "gb_per_s": info["weight_bytes"] / us / 1e3})
    tuned = {str(k): str(v) for k, v in getattr(triton_matvec._kernel(), "cache", {}).items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"model": args.model, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "repeats": args.repeats,
           "command": "python " + " ".join(sys.argv), "skipped_over_budget": skipped}
    (out / "results.json").write_text(json.dumps({"config": env, "results": results, "autotuned": tuned}, indent=2,
                                                 default=str) + "\n")
    names = [n for n in dict.fromkeys(r["variant"] for r in results) if swept_setting(n) is None]
    best = {}  # (projection, rows, kernel) -> the fastest swept setting
    for r in results:
        if swept_setting(r["variant"]) is not None:
            key = (r["projection"], r["rows"], r["variant"].rsplit(" ", 1)[0])
            if key not in best or r["us_per_call"] < best[key]["us_per_call"]:
                best[key] = r
    lines = [f"# Decode projections by rows: {args.model}, bf16, {env['gpu']} (us per call; GB/s of weight bytes)", "",
             "| projection | rows | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for (name, m) in dict.fromkeys((r["projection"], r["rows"]) for r in results):
        cells = []
        for v in names:
            r = next((r for r in results if r["projection"] == name and r["rows"] == m and r["variant"] == v), None)
            cells.append("-" if r is None else f"{r['us_per_call']:.1f} ({r['gb_per_s']:.0f})")
        lines.append(f"| {name} | {m} | " + " | ".join(cells) + " |")
    if best:
        lines += ["", "Fastest swept setting per projection, rows and kernel (us per call, GB/s):", ""]
        lines += [f"- {k[0]} rows={k[1]} {k[2]}: {v['variant'].rsplit(' ', 1)[1]} {v['us_per_call']:.1f} us "
                  f"({v['gb_per_s']:.0f} GB/s)" for k, v in best.items()]
    lines += ["", "Max rel err vs fp32 (int4 includes the quantization error): " + "; ".join(
        f"{r['projection']} r{r['rows']} {r['variant']} {r['rel_err']:.2g}" for r in results if r["rel_err"] is not None
        and r["rel_err"] > 0.02), "", "Not prepared (--budget-s) or failed: " + (", ".join(skipped) or "none"), "", f"Command: `{env['command']}`; torch {torch.__version__}."]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
