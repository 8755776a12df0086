"""kiln's decoder vs transformers with identical weights (kiln.llm.parity), as a results file.

    python benchmarks/llm_parity.py --model llama-3.2-3b --out DIR [--device cuda] [--compile]

Writes DIR/results.json and DIR/results.md (one row per comparison) and prints them; exits 1 when a
check fails. On the 3B shape on an H100 it takes ~30-60 s (HF fp32 model built on the GPU, two
forwards of 128 tokens per precision, 32 greedy fp32 steps each side; --compile adds kiln's compile).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys

import torch

from kiln.bench.results import write_results
from kiln.llm.config import resolve_model
from kiln.llm.parity import compare_with_hf
from kiln.monitor.env import collect_env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3.2-3b")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--positions", type=int, default=128)
    p.add_argument("--greedy-steps", type=int, default=32)
    p.add_argument("--compile", action="store_true", help="greedy tokens through kiln's compiled engine")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    result = compare_with_hf(resolve_model(args.model), device=args.device, low_dtype=low, positions=args.positions,
                             greedy_steps=args.greedy_steps, compile=args.compile)
    low_name = result.low_dtype
    rows = []
    for name, errors in (("kiln fp32", result.kiln_fp32), (f"hf {low_name}", result.hf_low),
                         (f"kiln {low_name}", result.kiln_low)):
        rows.append({"compare": f"{name} vs hf fp32 logits", "status": "ok", **dataclasses.asdict(errors)})
    rows.append({"compare": f"greedy fp32, {args.greedy_steps} steps", "status": "ok",
                 "identical_steps": result.greedy_identical_steps})
    for row, ok in zip(rows, (result.fp32_ok, None, result.low_ok, result.greedy_ok)):
        if ok is False:
            row["status"] = "accuracy_fail"
    command = shlex.join(["python", "benchmarks/llm_parity.py", *(argv if argv is not None else sys.argv[1:])])
    write_results(args.out, env=collect_env(), config={"args": vars(args), "result": result.to_json()}, results=rows,
                  columns=["compare", "status", "max_abs", "mean_abs", "top1_match", "identical_steps"],
                  title=f"kiln vs transformers, same weights: {args.model} on {args.device}", command=command)
    print(open(f"{args.out}/results.md", encoding="utf-8").read())
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
