"""GPU check of the flash and triton decode paths (kiln.llm.decode_attention) against the matmul path.

On the Llama-3.2-3B attention shape (24 query heads, 8 key/value heads, head dim 128) with a few
layers and random weights, bf16: a left-padded batch is prefilled into one cache per kernel, then
each decode step runs once per kernel on the same token; the logits must agree to bf16 rounding:
each is compared with an fp32 copy of the model (relative L2 error, top-1 agreement per step) and
a kernel passes when its error is at most 1.5x the matmul path's (results.json is written then).
Then a compiled, CUDA-graphed engine with each of `--compiled` generates greedily from the same
batch (one decode compile with tuning each: a minute or more). Writes results.json under --out.

    python benchmarks/decode_attention_check.py --out DIR [--layers 4] [--steps 24] [--compiled matmul,triton]
        [--target-programs 1] [--balance]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
from pathlib import Path

import torch

from kiln.llm import Engine
from kiln.llm.config import DecoderConfig, resolve_model
from kiln.llm.kernels import use_decode_kernels
from kiln.llm.model import Decoder, KVCache


def small_3b(layers: int) -> DecoderConfig:
    return dataclasses.replace(resolve_model("llama-3.2-3b").config, n_layers=layers, vocab_size=4096)


KERNELS = ("matmul", "flash", "triton")


def step_agreement(model: Decoder, prompts: torch.Tensor, pad: torch.Tensor, steps: int) -> list[dict]:
    """Per decode step: the bf16 logits of each kernel against an fp32 copy of the model (matmul
    path), so flash and triton are judged by the rounding the matmul path itself shows."""
    B, T = prompts.shape
    reference = copy.deepcopy(model).float()
    runs = {**{k: (use_decode_kernels(copy.deepcopy(model), attention=k), k, torch.bfloat16) for k in KERNELS},
            "fp32": (reference, "matmul", torch.float32)}
    caches = {name: KVCache(model.config, B, T + steps, dtype=dtype, device="cuda") for name, (_, _, dtype) in runs.items()}
    rows = []
    with torch.inference_mode():
        for name, (m, _, _) in runs.items():
            m(prompts, cache=caches[name], pad=pad)
        token = prompts[:, -1:]
        for t in range(T, T + steps):
            slot = torch.tensor([t], device="cuda")
            logits = {name: m(token, cache=caches[name], pad=pad, decode_slot=slot)[:, 0].float()
                      for name, (m, _, _) in runs.items()}
            ref = logits["fp32"]
            row = {"step": t}
            for name in KERNELS:
                row[f"{name}_rel_l2"] = float((logits[name] - ref).norm() / ref.norm())
                row[f"{name}_top1_agree"] = float((logits[name].argmax(-1) == ref.argmax(-1)).float().mean())
                if name != "matmul":
                    row[f"{name}_vs_matmul_max_abs"] = float((logits[name] - logits["matmul"]).abs().max())
            rows.append(row)
            token = ref.argmax(-1, keepdim=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--compiled", default="matmul,triton", help="kernels to generate with compiled (first = reference)")
    ap.add_argument("--target-programs", type=int, default=None,
                    help="kiln.kernels.triton_decode.TARGET_PROGRAMS for this check (1: every program of the triton "
                    "kernel loops over its row's blocks, as at a large batch; default: the module's)")
    ap.add_argument("--balance", action="store_true",
                    help="kiln.kernels.triton_decode.BALANCE for this check (looping chunks split each row's valid "
                    "range evenly; e.g. with --target-programs 48: two chunks of two blocks per row and head)")
    args = ap.parse_args(argv)
    compiled = args.compiled.split(",") if args.compiled else []
    if any(k not in KERNELS for k in compiled):
        print(f"decode_attention_check: --compiled: unknown kernel in {args.compiled!r} (valid: {', '.join(KERNELS)})",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("decode_attention_check: needs a CUDA device", file=sys.stderr)
        return 2
    if args.target_programs is not None or args.balance:
        from kiln.kernels import triton_decode

        if args.target_programs is not None:
            triton_decode.TARGET_PROGRAMS = args.target_programs
        triton_decode.BALANCE = triton_decode.BALANCE or args.balance
    torch.manual_seed(0)
    config = small_3b(args.layers)
    model = Decoder(config).to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    lengths = [96, 80, 45]
    T = max(lengths)
    prompts = torch.randint(0, config.vocab_size, (len(lengths), T), device="cuda")
    pad = torch.tensor([T - n for n in lengths], device="cuda")
    steps = step_agreement(model, prompts, pad, args.steps)
    worst = {name: max(r[f"{name}_rel_l2"] for r in steps) for name in KERNELS}
    result = {"config": {"layers": args.layers, "heads": config.n_heads, "kv_heads": config.n_kv_heads,
                         "head_dim": config.head_dim, "lengths": lengths, "steps": args.steps,
                         "target_programs": args.target_programs, "balance": args.balance},
              "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
              "eager_steps": steps, "worst_rel_l2_vs_fp32": worst,
              "passed": {k: worst[k] <= 1.5 * worst["matmul"] + 1e-3 for k in KERNELS if k != "matmul"}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")

    write()  # the eager comparison is kept even if the compiled part below is cut off
    verdicts = ", ".join(f"{k} {worst[k]:.2e} ({'pass' if ok else 'FAIL'})" for k, ok in result["passed"].items())
    print(f"decode logits vs fp32, worst relative L2 over {args.steps} steps x {len(lengths)} padded rows: "
          f"matmul {worst['matmul']:.2e}, {verdicts}", flush=True)
    generated, result["compiled_greedy_rows_identical"] = {}, {}
    batch = [prompts[i, T - n:].tolist() for i, n in enumerate(lengths)]
    for kernel in compiled:
        engine = Engine(model, compile=True, decode_attention=kernel)
        generated[kernel] = engine.generate(batch, max_new_tokens=args.steps).tokens
        if kernel != compiled[0]:
            same = [a == b for a, b in zip(generated[compiled[0]], generated[kernel])]
            result["compiled_greedy_rows_identical"][f"{kernel}_vs_{compiled[0]}"] = same
            write()
            print(f"compiled greedy rows identical ({kernel} vs {compiled[0]}): {same}", flush=True)
    return 0 if all(result["passed"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
