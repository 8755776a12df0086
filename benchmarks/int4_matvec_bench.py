"""Microbenchmark of one-token int4 matmuls on a GPU, per projection of a model's shape: torch's
tinygemm kernel (kiln's `torch` int4 layer; torchao's int4 layout runs the same op) against kiln's
Triton kernel (`int4@triton`, autotuned on its first call), with bf16 `linear` (cuBLAS) beside.

Each variant is captured as `--calls` (or more) back-to-back calls in one CUDA graph, cycling over
copies of the layer (distinct weights), enough copies that one cycle reads 3x the L2 cache in
int4 (kiln.bench.rotation; one layer's few MB would otherwise be read from L2, which a model's
layers never are), and replayed `--repeats` times, rounds interleaved; figures are the
median us per call and the GB/s of the bytes the layer holds (packed weights + scales). Each
layer's output is checked against its dequantized weight. Writes results.json and results.md.

    python benchmarks/int4_matvec_bench.py --out DIR [--model llama-3.2-3b] [--group-size 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from matvec_bench import per_step_line  # benchmarks/ is this script's own directory
from torch import nn

from kiln.bench.rotation import copies_beyond_l2, l2_bytes
from kiln.llm.config import resolve_model
from kiln.llm.quant import target_shapes
from kiln.llm.quant_torch import Int4WeightOnlyLinear
from kiln.timing import cuda_graph_of, replay_rounds


def layer_bytes(layer: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*layer.parameters(), *layer.buffers()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-3.2-3b")
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--calls", type=int, default=20, help="calls per graph replay, at least (more where 3x the L2 "
                    "cache needs more copies of the layer)")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("int4_matvec_bench: needs a CUDA device", file=sys.stderr)
        return 2
    from kiln.llm.int4_layout import Int4TritonLinear

    torch.manual_seed(0)
    dev = torch.device("cuda")
    config = resolve_model(args.model).config
    graphs, meta, rows, alive = {}, {}, [], []  # a graph does not keep its inputs alive: `alive` does
    l2 = l2_bytes(dev)
    for name, (out_f, in_f) in target_shapes(config, lm_head=True).items():
        x = torch.randn(1, 1, in_f, device=dev, dtype=torch.bfloat16)
        copies = []
        while not copies or len(copies) < copies_beyond_l2(layer_bytes(copies[0]["int4 triton"]), l2):
            linear = nn.Linear(in_f, out_f, bias=False, device=dev, dtype=torch.bfloat16)
            copies.append({"bf16 linear": linear,
                           "int4 tinygemm": Int4WeightOnlyLinear.from_linear(linear, args.group_size),
                           "int4 triton": Int4TritonLinear.from_linear(linear, args.group_size)})
        layers = copies[0]
        exact = nn.functional.linear(x.float(), layers["int4 triton"].dequantize(torch.float32))
        alive.append((x, copies))
        for variant, layer in layers.items():
            with torch.no_grad():
                y = layer(x)  # the Triton layer tunes itself here
                err = None if variant == "bf16 linear" else float((y.float() - exact).abs().max() / exact.abs().max())
                calls = max(args.calls, len(copies))  # cycling over the copies
                graphs[(name, variant)] = cuda_graph_of(
                    lambda v=variant, x=x, c=copies, n=calls: [c[i % len(c)][v](x) for i in range(n)], 1)
            meta[(name, variant)] = {"shape": [out_f, in_f], "bytes": layer_bytes(layer), "rel_err": err,
                                     "copies": len(copies), "calls_per_replay": calls}
            if variant == "int4 triton":  # the setting the autotuner chose for this shape
                from kiln.kernels import triton_matvec

                chosen = [str(c) for key, c in triton_matvec._kernel().cache.items() if out_f in key]
                meta[(name, variant)]["setting"] = chosen[-1] if chosen else None
            print(f"{name} {variant}: ready", flush=True)
    times = {key: [ms * 1000 / meta[key]["calls_per_replay"] for ms in samples]
             for key, samples in replay_rounds(graphs, args.repeats).items()}
    for (name, variant), samples in times.items():
        m = meta[(name, variant)]
        us = statistics.median(samples)
        rows.append({"projection": name, "variant": variant, **m, "us_per_call": us, "gb_per_s": m["bytes"] / us / 1e3})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"model": args.model, "group_size": args.group_size, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(), "min_calls_per_replay": args.calls, "l2_bytes": l2,
           "repeats": args.repeats}
    (out / "results.json").write_text(json.dumps({"config": env, "results": rows}, indent=2) + "\n")
    lines = [f"# One-token int4 matmuls: {args.model} shapes, group {args.group_size}, {env['gpu']}", "",
             "| projection | out x in | variant | us/call | GB/s of its bytes | max rel err vs dequantized |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        err = "-" if r["rel_err"] is None else f"{r['rel_err']:.2g}"
        lines.append(f"| {r['projection']} | {r['shape'][0]}x{r['shape'][1]} | {r['variant']} | {r['us_per_call']:.2f} "
                     f"| {r['gb_per_s']:.0f} | {err} |")
    lines += ["", per_step_line(rows, config.n_layers, ("bf16 linear", "int4 tinygemm", "int4 triton")),
              "", f"Command: `python {' '.join(sys.argv)}`; torch {torch.__version__}."]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
