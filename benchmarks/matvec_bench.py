"""Microbenchmark of a decode step's matrix-vector products on a GPU, per projection of a model's
shape, each with the elementwise work the model does around it (RMSNorm before wqkv, w_gate_up
and lm_head; SwiGLU before w_down; the residual add after wo and w_down):

- `inductor`: the eager math compiled by torch.compile with coordinate-descent tuning (what
  `kiln bench llm`'s kiln-compiled engine runs today: inductor fuses the norm / SwiGLU into its
  own reduction kernel);
- `cublas`: `F.linear` alone, no fused work (the library's matrix-vector kernel, for reference);
- `triton`: kiln.kernels.triton_matvec with the work fused, the autotuner's choice; the autotuner's
  own timings of its best settings are kept in results.json (`autotune_top`);
- with `--int4`: `int4 tinygemm` (torch's int4 op alone, the kernel behind torchao's int4) and
  `int4 triton` (kiln's kernel on kiln's int4 layout, with the work fused); their error column
  includes the quantization error.

Then every layer's four projections chained as in the model, in one CUDA graph: inductor, kiln's
kernel, and kiln's kernel with programmatic dependent launch (kiln.kernels.triton_launch.PDL).

Each variant is captured as `--calls` back-to-back calls in one CUDA graph, the calls cycling over
enough copies of the weight that they do not stay in L2 (as the model's layers do not), replayed
`--repeats` times with variants interleaved; figures are the median us per call and GB/s of the
weight bytes. Outputs are checked against an fp32 computation of the same math.

    python benchmarks/matvec_bench.py --out DIR [--model llama-3.2-3b] [--int4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kiln.bench.formulas import int4_weight_bytes
from kiln.llm.config import resolve_model
from kiln.llm.decode_matvec import fused_linear
from kiln.llm.model import RMSNorm
from kiln.timing import cuda_graph_of, replay_rounds

L2_BYTES = 50 * 2**20


def eager(kind: str, x, w, norm_w, res, eps: float):
    if kind == "rmsnorm":
        xf = x.float()
        x = norm_w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    if kind == "silu_mul":
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    y = F.linear(x, w)
    return y if res is None else res + y


def per_step_line(rows: list[dict], n_layers: int, variants) -> str:
    """The results line adding up each variant's per-call microseconds over one decode step."""
    total = {v: sum(r["us_per_call"] * (1 if r["projection"] == "lm_head" else n_layers)
                    for r in rows if r["variant"] == v) for v in variants}
    return "Per decode step (projections x layers, lm_head once): " + \
        ", ".join(f"{v} {t / 1000:.3f} ms" for v, t in total.items())


def rmsnorm(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def layer_eager(h, wqkv, wo, wgu, wd, n1, n2, eps: float, q: int):
    """One layer's projections as the model chains them, attention left out (wo reads q's part)."""
    qkv = F.linear(rmsnorm(h, n1, eps), wqkv)
    h = h + F.linear(qkv[..., :q], wo)
    gate, up = F.linear(rmsnorm(h, n2, eps), wgu).chunk(2, dim=-1)
    return h + F.linear(F.silu(gate) * up, wd)


def layer_triton(h, wqkv, wo, wgu, wd, n1, n2, eps: float, q: int):
    from kiln.kernels.triton_matvec import linear

    qkv = linear(h, wqkv, norm=(n1, eps))
    h = linear(qkv[..., :q], wo, residual=h)
    return linear(linear(h, wgu, norm=(n2, eps)), wd, silu_mul=True, residual=h)


def chain(config, dev, dt, compiled_layer, repeats: int) -> list[dict]:
    """Every layer's four projections back to back in one CUDA graph (a decode step without its
    attention and lm_head): inductor's fused reductions, kiln's kernel without and with
    programmatic dependent launch. Returns one row per variant (median ms per chain)."""
    from kiln.kernels import triton_launch

    q = config.n_heads * config.head_dim
    shapes = [(s[1], s[2]) for s in projections(config)[:4]]
    weights = [[torch.randn(o, i, device=dev, dtype=dt) / i**0.5 for o, i in shapes] for _ in range(config.n_layers)]
    norms = [[torch.rand(config.dim, device=dev, dtype=dt) + 0.5 for _ in range(2)] for _ in range(config.n_layers)]
    h0 = torch.randn(1, config.dim, device=dev, dtype=dt)
    eps = config.norm_eps

    def run(layer):
        h = h0
        for w, n in zip(weights, norms):
            h = layer(h, *w, *n, eps, q)
        return h

    graphs, outs = {}, {}
    for name, layer, pdl in (("inductor", compiled_layer, None), ("triton, no PDL", layer_triton, False),
                             ("triton, PDL", layer_triton, True)):
        if pdl is not None:
            triton_launch.PDL = pdl
        outs[name] = run(layer)
        graphs[name] = cuda_graph_of(lambda layer=layer: run(layer), 1)
        print(f"chain {name}: ready", flush=True)
    triton_launch.PDL = True
    times = replay_rounds(graphs, repeats)
    total = sum(o * i * 2 for o, i in shapes) * config.n_layers
    ref = outs["inductor"].float()
    return [{"variant": k, "ms_per_chain": statistics.median(v), "gb_per_s": total / statistics.median(v) / 1e6,
             "max_rel_diff_vs_inductor": float((outs[k].float() - ref).abs().max() / ref.abs().max())}
            for k, v in times.items()]


def projections(config) -> list[tuple[str, int, int, str, bool]]:
    """(name, out, in, prologue, residual) in the order a layer runs them."""
    q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    return [("attn.wqkv", q + 2 * kv, config.dim, "rmsnorm", False), ("attn.wo", config.dim, q, "none", True),
            ("ffn.w_gate_up", 2 * config.ffn_dim, config.dim, "rmsnorm", False),
            ("ffn.w_down", config.dim, config.ffn_dim, "silu_mul", True),
            ("lm_head", config.vocab_size, config.dim, "rmsnorm", False)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-3.2-3b")
    ap.add_argument("--calls", type=int, default=28)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--int4", action="store_true", help="also int4 (group 128): tinygemm alone, kiln's kernel fused")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("matvec_bench: needs a CUDA device", file=sys.stderr)
        return 2
    from kiln.kernels import triton_matvec

    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    config = resolve_model(args.model).config
    eps = config.norm_eps
    compiled = torch.compile(eager, options={"coordinate_descent_tuning": True}, fullgraph=True, dynamic=False)
    graphs, meta, alive = {}, {}, []  # a graph does not keep its inputs alive: `alive` does
    for name, out_f, in_f, prologue, residual in projections(config):
        wbytes = out_f * in_f * 2
        copies = max(2, min(args.calls, -(-3 * L2_BYTES // wbytes)))
        ws = [torch.randn(out_f, in_f, device=dev, dtype=dt) / in_f**0.5 for _ in range(copies)]
        x = torch.randn(1, 2 * in_f if prologue == "silu_mul" else in_f, device=dev, dtype=dt)
        norm_w = (torch.rand(in_f, device=dev, dtype=dt) + 0.5) if prologue == "rmsnorm" else None
        res = torch.randn(1, out_f, device=dev, dtype=dt) if residual else None
        alive.append((ws, x, norm_w, res))
        exact = eager(prologue, x.float(), ws[0].float(), None if norm_w is None else norm_w.float(),
                      None if res is None else res.float(), eps)
        variants = {
            "inductor": lambda w, p=prologue, x=x, n=norm_w, r=res: compiled(p, x, w, n, r, eps),
            "cublas": lambda w, x=x[:, :in_f]: F.linear(x, w),
            "triton": lambda w, p=prologue, x=x, n=norm_w, r=res: triton_matvec.linear(
                x, w, norm=None if n is None else (n, eps), silu_mul=p == "silu_mul", residual=r),
        }
        if args.int4:  # tinygemm alone (torch's int4 op, torchao's kernel) and kiln's kernel on int4, fused
            from kiln.llm.int4_layout import Int4TritonLinear
            from kiln.llm.quant_torch import Int4WeightOnlyLinear

            layers = {w.data_ptr(): nn.Linear(in_f, out_f, bias=False, device=dev, dtype=dt) for w in ws}
            for w, lin in zip(ws, layers.values()):
                lin.weight.data = w
            tiny = {k: Int4WeightOnlyLinear.from_linear(v, 128) for k, v in layers.items()}
            own = {k: Int4TritonLinear.from_linear(v, 128) for k, v in layers.items()}
            alive.append((tiny, own))
            variants["int4 tinygemm"] = lambda w, t=tiny, x=x[:, :in_f]: t[w.data_ptr()](x)
            norm = None
            if norm_w is not None:
                norm = RMSNorm(in_f, eps).to(dev, dt)
                norm.weight.data = norm_w
            variants["int4 triton"] = lambda w, o=own, p=prologue, x=x, n=norm, r=res: fused_linear(
                o[w.data_ptr()], x, norm=n, silu_mul=p == "silu_mul", residual=r)
        for variant, fn in variants.items():
            y = fn(ws[0])  # compiles / autotunes here, outside the graph
            err = None if variant in ("cublas", "int4 tinygemm") else \
                float((y.float() - exact).abs().max() / exact.abs().max())
            calls = [lambda fn=fn, w=w: fn(w) for w in ws]
            graphs[(name, variant)] = cuda_graph_of(lambda calls=calls: [c() for c in calls], 1)
            int4_bytes = int4_weight_bytes(out_f, in_f)
            meta[(name, variant)] = {"shape": [out_f, in_f], "prologue": prologue, "residual": residual,
                                     "weight_bytes": int4_bytes if variant.startswith("int4") else wbytes, "rel_err": err, "copies": copies,
                                     "calls_per_replay": copies}
            if variant in ("triton", "int4 triton"):  # the autotuner's own timings of every setting, fastest first
                timings = getattr(triton_matvec._kernel(), "configs_timings", None) or {}
                ranked = sorted(timings.items(), key=lambda kv: kv[1][0] if isinstance(kv[1], list) else kv[1])
                meta[(name, variant)]["autotune_top"] = [[str(c), t] for c, t in ranked[:10]]
            print(f"{name} {variant}: ready", flush=True)
    compiled_layer = torch.compile(layer_eager, options={"coordinate_descent_tuning": True}, fullgraph=True,
                                   dynamic=False)
    chained = chain(config, dev, dt, compiled_layer, args.repeats)
    tuned = {str(key): str(cfg) for key, cfg in getattr(triton_matvec._kernel(), "cache", {}).items()}
    times = {key: [ms * 1000 / meta[key]["calls_per_replay"] for ms in samples]
             for key, samples in replay_rounds(graphs, args.repeats).items()}
    rows = []
    for (name, variant), samples in times.items():
        m = meta[(name, variant)]
        us = statistics.median(samples)
        rows.append({"projection": name, "variant": variant, **m, "us_per_call": us,
                     "gb_per_s": m["weight_bytes"] / us / 1e3})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"model": args.model, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
           "repeats": args.repeats}
    (out / "results.json").write_text(json.dumps({"config": env, "results": rows, "chain": chained, "autotuned": tuned},
                                                 indent=2, default=str) + "\n")
    lines = [f"# Decode matrix-vector products with their fused work: {args.model}, bf16, batch 1, {env['gpu']}", "",
             "| projection | out x in | fused | variant | us/call | GB/s of weights | max rel err vs fp32 |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        err = "-" if r["rel_err"] is None else f"{r['rel_err']:.2g}"
        fused = "+".join(p for p in (r["prologue"] if r["prologue"] != "none" else "", "residual" if r["residual"] else "") if p)
        lines.append(f"| {r['projection']} | {r['shape'][0]}x{r['shape'][1]} | {fused or '-'} | {r['variant']} "
                     f"| {r['us_per_call']:.2f} | {r['gb_per_s']:.0f} | {err} |")
    lines += ["", per_step_line(rows, config.n_layers, variants),
              "", f"All {config.n_layers} layers' four projections chained in one CUDA graph (h -> h, attention left out):",
              "", "| variant | ms per chain | GB/s of weights | max rel diff vs inductor |", "|---|---|---|---|"]
    lines += [f"| {c['variant']} | {c['ms_per_chain']:.3f} | {c['gb_per_s']:.0f} | {c['max_rel_diff_vs_inductor']:.2g} |"
              for c in chained]
    lines += ["", "Autotuner's choice per (N, K, rows, prologue, residual): " +
              "; ".join(f"{k}: {v}" for k, v in tuned.items()),
              "", f"Command: `python {' '.join(sys.argv)}`; torch {torch.__version__}."]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
