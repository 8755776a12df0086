"""Microbenchmark of int4 weight products by rows on a GPU: each linear shape of a model (wqkv, wo,
w_gate_up, w_down, lm_head; group 128, no fused work) at each row count M, through

- `bf16`: `F.linear` on the dense bf16 weight (cuBLAS);
- `bf16 skinny`: kiln.kernels.triton_skinny on the dense weight (its table's or rule's setting), M <= 64;
- `int4`: kiln's int4 layer (`Int4TritonLinear`), the kernel kiln.llm.int4_layout.int4_path picks by M;
- `tinygemm`: torch's int4 kernel (`aten._weight_int4pack_mm`, gpt-fast's and torchao's int4);
- `int4 matvec`: kiln.kernels.triton_int4, the one-row kernel (programs per row), M <= 8;
- `int4 rows`: kiln.kernels.triton_rows, one weight read for all rows (the setting its rule picks), M <= 64;
- `dequant`: kiln.kernels.triton_int4_dequant then the bf16 matmul (prefill), M > 64;
- `gemlite KERNEL`: gemlite's Triton kernels (kiln.llm.int4_gemlite, `pip install 'kiln[gemlite]'`)
  on kiln's very int4 tensors: at each M the kernel gemlite itself picks (GEMV_REVSPLITK up to 4
  rows, GEMM_SPLITK below 64, GEMM above), and each kernel of `--gemlite-kernels` that serves M
  (GEMV kinds up to 16 rows, GEMM_SPLITK up to 64, GEMM from 16); skipped with the reason when
  gemlite does not import. Its launch settings come from the table it ships for this GPU (H100's
  on an H200); a shape the table lacks is autotuned (gemlite's "fast" set) on its first call;
- with `--sweep-rows` (16 and/or 64), `int4 rows BN/SPLIT/warps/stages/BM/PREFETCH/SWAP`: other launch
  settings at those rows (the first model's shapes), to check the rule.

Each variant is captured as back-to-back calls cycling over enough weight copies to miss L2, in one
CUDA graph, replayed `--repeats` times with variants interleaved; figures are the median us per call,
the weight bytes read per second (int4: the packed words plus scales and offsets), that rate as a
fraction of the datasheet's (`--spec-tb-s`, 3.35 for an H100 SXM) and of a read-only stream
measured in the same process (kiln.bench.ceilings), and TFLOP/s. Outputs are checked against an
fp32 product with the layer's dequantized weight (`rel_err`). Every variant's first call (Triton's
compile, gemlite's autotuning) runs before capture and is timed (`first_call_s`; gemlite's sum in
the summary).

    python benchmarks/int4_gemm_bench.py --out DIR [--models llama-3.2-3b,llama-3.1-8b]
        [--rows 1,2,4,8,16,32,64,512] [--sweep-rows 16,64] [--budget-s S]
        [--gemlite-kernels GEMV,GEMV_REVSPLITK,GEMM_SPLITK,GEMM]
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

from kiln.bench.ceilings import measure_read_bandwidth
from kiln.bench.formulas import int4_weight_bytes
from kiln.llm.config import resolve_model
from kiln.timing import cuda_graph_of, replay_rounds

sys.path.insert(0, str(Path(__file__).parent))
from matvec_bench import L2_BYTES, projections  # noqa: E402  (the same shapes)
from rows_bench import swept_setting  # noqa: E402  (a swept variant's launch setting, named the same way)

GROUP = 128
SWEEP = {
    16: [(128, split, 4, 3, 16, 0, 0) for split in (1, 2, 4, 8)]
    + [(bn, split, warps, 3, 16, 0, 1) for bn in (128, 256) for split in (1, 2, 4, 8) for warps in (4, 8)],
    32: [(128, split, 4, 3, bm, 0, 1) for split in (1, 2, 4, 8) for bm in (16, 32)],
    64: [(128, split, 4, 3, bm, 0, 1) for split in (1, 2, 4) for bm in (16, 32, 64)],
}
"""Launch settings (BLOCK_N, SPLIT, warps, stages, BLOCK_M, PREFETCH, SWAP) swept at some row counts: at 16
rows the unpacked-tile loop (SWAP 0) beside the swapped one (kiln.kernels.triton_rows), at 32 rows
row blocks of 32 (one) against 16 (two)."""


def int4_bytes(out_f: int, in_f: int) -> int:
    return int4_weight_bytes(out_f, in_f, GROUP)


GEMLITE_ROWS = {"GEMV": (1, 16), "GEMV_REVSPLITK": (1, 16), "GEMV_SPLITK": (1, 16), "GEMM_SPLITK": (1, 64),
                "GEMM": (16, 1 << 20)}
"""Rows (least, most) at which a gemlite kernel is timed when named in --gemlite-kernels."""


def gemlite_variants(rows: int, choice: str | None, kernels: list[str]) -> list[str]:
    """`gemlite KERNEL` names at `rows` rows: gemlite's own `choice` first, then each of `kernels` serving them."""
    if choice is None:
        return []
    extra = [k for k in kernels if k != choice and GEMLITE_ROWS[k][0] <= rows <= GEMLITE_ROWS[k][1]]
    return [f"gemlite {k}" for k in [choice, *extra]]


def variants_for(rows: int, sweep: bool, sms: int, out_f: int, gemlite: list[str] | None = None) -> list[str]:
    from kiln.kernels.triton_rows import MAX_ROWS

    names = ["bf16"] + (["bf16 skinny"] if rows <= MAX_ROWS else []) + ["tinygemm", "int4"] + (
        ["int4 rows"] if rows <= MAX_ROWS else ["dequant"]) + (
        ["int4 matvec"] if rows <= 8 else []) + (gemlite or [])
    if sweep:
        names += ["int4 rows " + "/".join(map(str, s)) for s in SWEEP.get(rows, [])
                  if -(-rows // s[4]) * -(-out_f // s[0]) * s[1] >= sms // 2]
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="llama-3.2-3b,llama-3.1-8b")
    ap.add_argument("--rows", default="1,2,4,8,16,32,64,512")
    ap.add_argument("--sweep-rows", default="", help="rows at which the first model's shapes sweep launch settings")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--spec-tb-s", type=float, default=3.35, help="the GPU's datasheet memory bandwidth, TB/s")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="prepare no new (shape, rows) case after this many seconds; time and write what is ready")
    ap.add_argument("--gemlite-kernels", default="",
                    help="gemlite kernels timed besides the one it picks: GEMV, GEMV_REVSPLITK, GEMV_SPLITK, GEMM_SPLITK, GEMM")
    args = ap.parse_args(argv)
    gemlite_kernels = [k for k in args.gemlite_kernels.split(",") if k]
    if bad := [k for k in gemlite_kernels if k not in GEMLITE_ROWS]:
        ap.error(f"--gemlite-kernels: unknown {bad[0]!r}; choose from {', '.join(GEMLITE_ROWS)}")
    if not torch.cuda.is_available():
        print("int4_gemm_bench: needs a CUDA device", file=sys.stderr)
        return 2
    import kiln.kernels.triton_int4_dequant  # noqa: F401  (registers the ops)
    import kiln.kernels.triton_skinny  # noqa: F401
    from kiln.llm.int4_layout import Int4TritonLinear
    from kiln.llm.quant_torch import Int4WeightOnlyLinear

    gemlite, gemlite_env = gemlite_setup()

    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    stream_bps, stream_kernel, _ = measure_read_bandwidth(dev)
    spec_bps = args.spec_tb_s * 1e12
    row_counts = [int(r) for r in args.rows.split(",")]
    sweep_rows = {int(r) for r in args.sweep_rows.split(",") if r}
    models = args.models.split(",")
    graphs, meta, alive, fused_checks = {}, {}, [], []
    skipped = [] if gemlite else [f"gemlite: {gemlite_env['missing']}"]
    unused_scale = torch.zeros((), device=dev)  # gemlite's op takes an fp4 meta scale int4 does not read
    started = time.perf_counter()
    for model in models:
        config = resolve_model(model).config
        for name, out_f, in_f, _, _ in projections(config):
            if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
                skipped.append(f"{model} {name}")
                continue
            copies_bf16 = max(2, min(16, -(-3 * L2_BYTES // (out_f * in_f * 2))))
            copies_int4 = max(2, min(16, -(-3 * L2_BYTES // int4_bytes(out_f, in_f))))
            ws = [torch.randn(out_f, in_f, device=dev, dtype=dt) / in_f**0.5 for _ in range(copies_int4)]
            own, tiny = [], []
            for w in ws:
                lin = nn.Linear(in_f, out_f, bias=False, device=dev, dtype=dt)
                lin.weight.data = w
                own.append(Int4TritonLinear.from_linear(lin, GROUP))
                tiny.append(Int4WeightOnlyLinear.from_linear(lin, GROUP))
            ws = ws[:copies_bf16]
            deq = own[0].dequantize(torch.float32)
            alive.append((ws, own, tiny))
            if gemlite and "packing_equal" not in gemlite_env:
                gemlite_env["packing_equal"] = gemlite_packing_equal(gemlite, own[0])
            for m in row_counts:
                x = torch.randn(m, in_f, device=dev, dtype=dt)
                exact = x.float() @ deq.t()
                alive.append(x)
                ops = {
                    "bf16": [lambda w=w, x=x: F.linear(x, w) for w in ws],
                    "bf16 skinny": [lambda w=w, x=x: torch.ops.kiln.skinny(x, w, None, None, 0.0, False, None) for w in ws],
                    "tinygemm": [lambda t=t, x=x: torch.ops.aten._weight_int4pack_mm(x, t.weight, GROUP, t.scales_and_zeros)
                                 for t in tiny],
                    "int4 matvec": [lambda o=o, x=x: torch.ops.kiln.int4_matvec(x, o.weight, o.scale, o.offset, GROUP)
                                    for o in own],
                    "dequant": [lambda o=o, x=x: torch.ops.kiln.int4_linear_dequant(x, o.weight, o.scale, o.offset, GROUP)
                                for o in own],
                    "int4": [lambda o=o, x=x: o(x) for o in own],
                }
                choice = gemlite.core.get_matmul_type(m, 4) if gemlite else None
                for kernel in GEMLITE_ROWS:
                    ops[f"gemlite {kernel}"] = [lambda o=o, x=x, k=kernel: gemlite_call(x, o, k, unused_scale) for o in own]
                if m in (8, 16) and name == "attn.wqkv":
                    fused_checks.append(fused_check(own[0], deq, x, config.norm_eps, f"{model} {name} rows={m}"))
                sweeping = m in sweep_rows and model == models[0]
                for variant in variants_for(m, sweeping, sms, out_f, gemlite_variants(m, choice, gemlite_kernels)):
                    setting = swept_setting(variant)
                    if variant.startswith("int4 rows"):
                        calls = [lambda o=o, x=x, st=setting: torch.ops.kiln.int4_rows(
                            x, o.weight, o.scale, o.offset, GROUP, None, None, 0.0, "none", False, None, st) for o in own]
                    else:
                        calls = ops[variant]
                    try:
                        first = time.perf_counter()
                        calls[0]()  # compiles (and gemlite autotunes) here, outside the graph
                        torch.cuda.synchronize()
                        first = time.perf_counter() - first
                        # checked on a second call: autotuning reruns gemlite's split-K kernels, which add
                        # into the first call's output
                        y = calls[0]()
                    except Exception as exc:  # a setting this GPU cannot run (shared memory): skip it
                        skipped.append(f"{model} {name} rows={m} {variant}: {type(exc).__name__}: {str(exc)[:120]}")
                        continue
                    err = float((y.float() - exact).abs().max() / exact.abs().max()) if variant[:4] != "bf16" else None
                    key = (model, name, m, variant)
                    graphs[key] = cuda_graph_of(lambda calls=calls: [c() for c in calls], 1)
                    wbytes = out_f * in_f * 2 if variant.startswith("bf16") else int4_bytes(out_f, in_f)
                    meta[key] = {"model": model, "projection": name, "shape": [out_f, in_f], "rows": m,
                                 "variant": variant, "weight_bytes": wbytes, "rel_err": err, "calls_per_replay": len(calls),
                                 "first_call_s": first, "gemlite_choice": variant == f"gemlite {choice}"}
                print(f"{model} {name} rows={m}: ready ({time.perf_counter() - started:.0f} s)", flush=True)
    times = {key: [ms * 1000 / meta[key]["calls_per_replay"] for ms in samples]
             for key, samples in replay_rounds(graphs, args.repeats).items()}
    results = []
    for key, samples in times.items():
        info = meta[key]
        us = statistics.median(samples)
        bps = info["weight_bytes"] / (us * 1e-6)
        flops = 2 * info["rows"] * info["shape"][0] * info["shape"][1] / (us * 1e-6)
        results.append({**info, "us_per_call": us, "us_p10": statistics.quantiles(samples, n=10)[0],
                        "us_p90": statistics.quantiles(samples, n=10)[-1], "gb_per_s": bps / 1e9,
                        "of_stream": bps / stream_bps, "of_spec": bps / spec_bps, "tflop_s": flops / 1e12})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"models": models, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "sms": sms,
           "repeats": args.repeats, "stream_read_gb_s": stream_bps / 1e9, "stream_kernel": stream_kernel,
           "spec_tb_s": args.spec_tb_s, "command": "python " + " ".join(sys.argv), "skipped": skipped,
           "fused_checks": fused_checks, "gemlite": gemlite_env,
           "gemlite_first_calls_s": sum(v["first_call_s"] for v in meta.values() if v["variant"].startswith("gemlite"))}
    (out / "results.json").write_text(json.dumps({"config": env, "results": results}, indent=2) + "\n")
    (out / "results.md").write_text(summary(results, env) + "\n")
    print(summary(results, env))
    return 0


def gemlite_setup() -> tuple[object | None, dict]:
    """gemlite (None when it cannot run here) and what to record of it: version and launch-settings
    table, or why it is missing."""
    from kiln.llm.int4_gemlite import gemlite_missing, load_gemlite

    missing = gemlite_missing()
    if missing:
        print(f"int4_gemm_bench: gemlite rows skipped: {missing}", flush=True)
        return None, {"missing": missing}
    gemlite = load_gemlite()
    return gemlite, {"version": gemlite.__version__, "config_table": gemlite.core.selected_tag}


def gemlite_call(x: torch.Tensor, layer, kernel: str, unused_scale: torch.Tensor) -> torch.Tensor:
    """gemlite's op on kiln's int4 tensors (kiln.llm.int4_gemlite: the same words, scales and offsets)."""
    from kiln.llm.int4_gemlite import kernel_index, meta_args

    return torch.ops.gemlite.forward_functional(x, None, [layer.weight, layer.scale, layer.offset, unused_scale],
                                                meta_args(GROUP, x.dtype), kernel_index(kernel))


def gemlite_packing_equal(gemlite, layer) -> bool:
    """Whether gemlite's own 32-bit packing of the layer's 4-bit values gives kiln's words bit for bit."""
    from kiln.llm.int4_layout import unpack_words

    q = unpack_words(layer.weight).to(torch.uint8)
    words, per_word = gemlite.bitpack.pack_weights_over_cols_triton(q, 4, 32, True)
    return per_word == 8 and torch.equal(words.contiguous(), layer.weight)


def fused_check(layer, deq: torch.Tensor, x: torch.Tensor, eps: float, what: str) -> dict:
    """The row kernel with the decode step's fused parts (the folded norm's 1/rms before, a residual
    after; the SwiGLU epilogue) against fp32 math: max error relative to the largest output."""
    res = torch.randn(x.shape[0], deq.shape[0], device=x.device, dtype=x.dtype)
    xf = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    y = torch.ops.kiln.int4_rows(x, layer.weight, layer.scale, layer.offset, GROUP, None, None, eps, "rms", False, res)
    ref = xf @ deq.t() + res.float()
    act = torch.ops.kiln.int4_rows(x, layer.weight, layer.scale, layer.offset, GROUP, None, None, eps, "rms", True, None)
    gate, up = (xf @ deq.t()).view(x.shape[0], -1, 2).unbind(-1)
    ref_act = F.silu(gate) * up
    return {"case": what, "rms_residual_rel_err": float((y.float() - ref).abs().max() / ref.abs().max()),
            "rms_swiglu_rel_err": float((act.float() - ref_act).abs().max() / ref_act.abs().max())}


def summary(results: list[dict], env: dict) -> str:
    """A table per model: us per call (fraction of the read stream) per variant; the best swept setting."""
    names = [n for n in dict.fromkeys(r["variant"] for r in results) if swept_setting(n) is None]
    lines = [f"# int4 products by rows, {env['gpu']} (us per call; weight bytes/s as a fraction of the read "
             f"stream {env['stream_read_gb_s']:.0f} GB/s and of the datasheet {env['spec_tb_s']} TB/s)", ""]
    for model in dict.fromkeys(r["model"] for r in results):
        lines += [f"## {model}", "", "| projection | rows | " + " | ".join(names) + " | best swept |",
                  "|---|---|" + "---|" * (len(names) + 1)]
        for name, m in dict.fromkeys((r["projection"], r["rows"]) for r in results if r["model"] == model):
            mine = [r for r in results if r["model"] == model and r["projection"] == name and r["rows"] == m]
            cells = []
            for v in names:
                r = next((r for r in mine if r["variant"] == v), None)
                cells.append("-" if r is None else f"{r['us_per_call']:.1f} ({r['of_stream']:.0%}/{r['of_spec']:.0%})")
            swept = [r for r in mine if swept_setting(r["variant"]) is not None]
            best = min(swept, key=lambda r: r["us_per_call"], default=None)
            cells.append("-" if best is None else f"{best['variant'].rsplit(' ', 1)[1]} {best['us_per_call']:.1f}")
            lines.append(f"| {name} | {m} | " + " | ".join(cells) + " |")
        lines.append("")
    errs = [r for r in results if r["rel_err"] is not None and r["rel_err"] > 0.02]
    lines += ["Fused parts at 8 and 16 rows (relative error vs fp32): " + "; ".join(
        f"{c['case']}: rms+residual {c['rms_residual_rel_err']:.2g}, rms+swiglu {c['rms_swiglu_rel_err']:.2g}"
        for c in env["fused_checks"]), ""]
    lines += ["Relative errors above 2 % vs fp32 with the dequantized weight: " + (
        "; ".join(f"{r['model']} {r['projection']} r{r['rows']} {r['variant']} {r['rel_err']:.2g}" for r in errs) or "none"),
        "", "Skipped: " + ("; ".join(env["skipped"]) or "none"), ""]
    if "version" in env["gemlite"]:
        g = env["gemlite"]
        lines += [f"gemlite {g['version']}: table {g['config_table']}, its packing equals "
                  f"kiln's words: {g.get('packing_equal')}; first calls (compile + autotune) {env['gemlite_first_calls_s']:.0f} s; "
                  "its own pick by rows: " + ", ".join(f"{r['rows']}: {r['variant'][8:]}" for r in dict(
                      ((r["rows"]), r) for r in results if r.get("gemlite_choice")).values()), ""]
    lines.append(f"Command: `{env['command']}`; torch {env['torch']}.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
