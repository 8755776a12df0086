"""Microbenchmark of a decode step's projections at several batch sizes (rows) on a GPU, per
projection of a model's shape, each with the work the model fuses around it (RMSNorm before wqkv,
w_gate_up and lm_head; SwiGLU before w_down; the residual add after wo and w_down):

- `cublas`: `F.linear` alone (no fused work), the library's skinny GEMM;
- `matvec`: kiln.kernels.triton_matvec, the one-row kernel (programs per row), rows <= its MAX_ROWS;
- with `--int4`, group 128: `int4 matvec` (kiln.kernels.triton_int4, per row) and `int4 rows`
  (kiln.kernels.triton_rows, one weight read for all rows, `tl.dot`).
With `--sweep`, also every launch setting of the int4 row kernel (`int4 rows BN/SPLIT`), each in its
own CUDA graph: the settings the autotuner chooses from, timed as the model runs them.

Each variant is captured as back-to-back calls cycling over enough weight copies to miss L2, in one
CUDA graph, replayed `--repeats` times with variants interleaved; figures are the median us per call
and GB/s of the weight bytes (the bytes a step must read whatever its batch). Outputs are checked
against an fp32 computation of the same math. The autotuner's choices are kept in results.json.

    python benchmarks/rows_bench.py --out DIR [--model llama-3.2-3b] [--rows 1,2,4,8,16,32,64] [--int4]
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

from kiln.llm.config import resolve_model
from kiln.timing import cuda_graph_of, replay_rounds

sys.path.insert(0, str(Path(__file__).parent))
from matvec_bench import L2_BYTES, eager, projections  # noqa: E402  (the same shapes and reference math)


def variants_for(rows: int, int4: bool, sweep: bool) -> list[str]:
    from kiln.kernels.triton_matvec import MAX_ROWS
    from kiln.kernels.triton_rows import SWEEP_SETTINGS

    names = ["cublas"] + (["matvec"] if rows <= MAX_ROWS else [])
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
    ap.add_argument("--sweep", action="store_true", help="also every launch setting of the row kernels")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="prepare no new (projection, rows) case after this many seconds; time and write what is ready")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("rows_bench: needs a CUDA device", file=sys.stderr)
        return 2
    from kiln.kernels import triton_int4, triton_matvec, triton_rows  # noqa: F401  (registers the ops)
    from kiln.llm.int4_layout import Int4TritonLinear

    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    config = resolve_model(args.model).config
    eps = config.norm_eps
    row_counts = [int(r) for r in args.rows.split(",")]
    graphs, meta, alive = {}, {}, []
    started, skipped = time.perf_counter(), []
    for name, out_f, in_f, prologue, residual in projections(config):
        wbytes = out_f * in_f * 2
        copies = max(2, min(args.calls, -(-3 * L2_BYTES // wbytes)))
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
            }
            if own:
                for variant, op in (("int4 matvec", torch.ops.kiln.int4_matvec), ("int4 rows", torch.ops.kiln.int4_rows)):
                    fns[variant] = lambda w, st=None, p=prologue, x=x, r=res, op=op, nw=norm_w, o=own: op(
                        x, o[w.data_ptr()].weight, o[w.data_ptr()].scale, o[w.data_ptr()].offset, 128, None,
                        nw, eps, "rmsnorm" if nw is not None else "silu_mul" if p == "silu_mul" else "none",
                        False, r, st)
            for variant in variants_for(m, bool(own), args.sweep):
                base, setting = variant.rsplit(" ", 1)[0] if swept_setting(variant) else variant, swept_setting(variant)
                fn = fns[base] if setting is None else (
                    lambda w, f=fns[base], st=setting: f(w, st))
                y = fn(ws[0])  # autotunes here, outside the graph
                err = None if variant == "cublas" else float((y.float() - exact).abs().max() / exact.abs().max())
                calls = [lambda fn=fn, w=w: fn(w) for w in ws]
                graphs[(name, m, variant)] = cuda_graph_of(lambda calls=calls: [c() for c in calls], 1)
                int4_bytes = out_f * in_f // 2 + 2 * out_f * (in_f // 128) * 2
                meta[(name, m, variant)] = {"shape": [out_f, in_f], "prologue": prologue, "residual": residual,
                                            "weight_bytes": int4_bytes if variant.startswith("int4") else wbytes,
                                            "rel_err": err, "calls_per_replay": copies}
            print(f"{name} rows={m}: ready", flush=True)
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
        and r["rel_err"] > 0.02), "", "Not prepared within --budget-s: " + (", ".join(skipped) or "none"), "", f"Command: `{env['command']}`; torch {torch.__version__}."]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
