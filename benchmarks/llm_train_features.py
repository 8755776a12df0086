"""Microbenchmark of two LLM training features on one device: the cross-entropy kernels
(`training.ce_kernel`) and the activation checkpointing modes (`training.activation_checkpointing`).

Part `ce`: hidden states [tokens, dim] through an output layer [vocab, dim] into the mean
next-token loss, forward + backward under bf16 autocast with fp32 masters (precision.policy
bf16-mixed), for `plain` (logits then F.cross_entropy, eager as kiln runs it with compile.scope
model), `plain-compiled` (the same function through torch.compile, as scope model+loss fuses
it), `chunked` and `liger` (when liger-kernel imports). Per row: median ms of forward+backward,
peak memory above what the inputs hold, and the loss and gradient differences from `plain`.

Part `ac`: kiln's decoder of `--model` (optionally fewer layers), batch x seq tokens, forward +
backward with the chunked loss, for `none`, `full` and `selective` checkpointing (eager, or each
block compiled with `--compile`). Per row: median ms, tokens/s, peak memory, and the largest
gradient difference from `none` relative to its norm.

A failing row records its error and the next row still runs. Writes results.json and results.md
under --out through kiln.bench.results.write_results, timing through kiln.timing.

    python benchmarks/llm_train_features.py --out DIR                          # both parts, H100 shapes
    python benchmarks/llm_train_features.py --out DIR --parts ce --tokens 8192,16384
    python benchmarks/llm_train_features.py --out DIR --device cpu --vocab 512 --dim 64 --tokens 256 \\
        --model llama-tiny --batch 2 --seq-len 64 --repeats 2                 # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch

from kiln.bench.results import refuse_held_results, write_results
from kiln.monitor.env import collect_env
from kiln.timing import measure
from kiln.train.activation_checkpoint import apply_activation_checkpointing
from kiln.train.cross_entropy import hidden_state_loss, linear_cross_entropy


def _peak_reset(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _peak_since(device: torch.device, base: int) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30))


def _ce_row(row: dict, kernel: str, h, w, t, device: torch.device, repeats: int, reference) -> tuple:
    """Fill `row` for one kernel; returns (loss, grad h, grad w) for the differences."""
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    if kernel == "plain-compiled":
        fn = torch.compile(lambda a, b, c: linear_cross_entropy(a, b, c, "plain"))
    else:
        fn = lambda a, b, c: linear_cross_entropy(a, b, c, kernel)  # noqa: E731

    def step():
        h.grad = w.grad = None
        with autocast:
            loss = fn(h, w, t)
        loss.backward()
        return loss

    loss = step()  # compiles / warms up
    result = (loss.detach().float(), h.grad.clone(), w.grad.clone())
    h.grad = w.grad = None
    base = _peak_reset(device)
    step()
    peak = _peak_since(device, base)
    row["peak_mem_mib"] = None if peak is None else round(peak / 2**20, 1)
    row["ms"] = round(measure(step, warmup=2, repeats=repeats, device=device).median_s * 1e3, 3)
    reference = reference or result
    row["loss"] = float(result[0])
    row["loss_diff"] = abs(float(result[0] - reference[0]))
    row["grad_h_rel"] = _rel(result[1], reference[1])
    row["grad_w_rel"] = _rel(result[2], reference[2])
    h.grad = w.grad = None
    return result


def _error(exc: Exception) -> str:
    text = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


def ce_rows(args, device: torch.device) -> list[dict]:
    rows = []
    for n in args.tokens:
        gen = torch.Generator(device=device).manual_seed(0)
        h = torch.randn(n, args.dim, device=device, generator=gen).requires_grad_()
        w = (torch.randn(args.vocab, args.dim, device=device, generator=gen) * 0.02).requires_grad_()
        t = torch.randint(args.vocab, (n,), device=device, generator=gen)
        reference = None
        for kernel in ("plain", "plain-compiled", "chunked", "liger"):
            row = {"part": "ce", "tokens": n, "vocab": args.vocab, "dim": args.dim, "kernel": kernel, "status": "ok"}
            try:
                result = _ce_row(row, kernel, h, w, t, device, args.repeats, reference)
                reference = reference or result
            except Exception as exc:
                row.update(status="error", reason=_error(exc))
                traceback.print_exc()
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def _decoder(args, device: torch.device):
    from kiln.llm.config import resolve_model
    from kiln.llm.model import Decoder
    from kiln.llm.weights import init_random

    raw = dict(resolve_model(args.model).raw)
    if args.layers:
        raw["num_hidden_layers"] = args.layers
    from kiln.llm.config import config_from_dict

    with torch.device(device):
        model = Decoder(config_from_dict(raw))
    return init_random(model, seed=0).train()


def _ac_row(row: dict, args, device: torch.device, mode: str) -> dict:
    """Fill `row` for one checkpointing mode; returns some gradients for the differences."""
    model = _decoder(args, device)
    gen = torch.Generator(device=device).manual_seed(1)  # the same batch for every mode
    window = torch.randint(model.config.vocab_size, (args.batch, args.seq_len + 1), device=device, generator=gen)
    tokens, targets = window[:, :-1], window[:, 1:]
    apply_activation_checkpointing(list(model.layers), mode)
    if args.compile:
        for block in model.layers:
            block.compile()
    loss_fn = hidden_state_loss(model, "chunked")

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(tokens, targets)
        loss.backward()

    step()
    grads = {n: p.grad.clone() for n, p in list(model.named_parameters())[:6]}
    model.zero_grad(set_to_none=True)
    base = _peak_reset(device)
    step()
    peak = _peak_since(device, base)
    row["peak_mem_gib"] = None if peak is None else round(peak / 2**30, 2)
    row["ms"] = round(measure(step, warmup=2, repeats=args.repeats, device=device).median_s * 1e3, 2)
    row["tokens_per_s"] = round(args.batch * args.seq_len / row["ms"] * 1e3)
    return grads


def ac_rows(args, device: torch.device) -> list[dict]:
    rows, reference = [], None
    for mode in ("none", "full", "selective"):
        row = {"part": "ac", "model": args.model, "layers": args.layers or "all", "batch": args.batch,
               "seq_len": args.seq_len, "mode": mode, "compiled": args.compile, "status": "ok"}
        try:
            grads = _ac_row(row, args, device, mode)
            reference = reference or grads
            row["grad_rel_max"] = max(_rel(grads[n], reference[n]) for n in grads)
        except Exception as exc:
            row.update(status="error", reason=_error(exc))
            traceback.print_exc()
        print(json.dumps(row), flush=True)
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


CE_COLUMNS = ["tokens", "vocab", "dim", "kernel", "status", "ms", "peak_mem_mib", "loss_diff", "grad_h_rel",
              "grad_w_rel", "reason"]
AC_COLUMNS = ["model", "layers", "batch", "seq_len", "mode", "compiled", "status", "ms", "tokens_per_s",
              "peak_mem_gib", "grad_rel_max", "reason"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--parts", default="ce,ac", help="comma-separated: ce, ac")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--tokens", default="8192,16384", help="comma-separated token counts for part ce")
    ap.add_argument("--model", default="llama-3.2-1b", help="kiln.llm preset or config.json for part ac")
    ap.add_argument("--layers", type=int, default=0, help="part ac: decoder layers (0 = the model's)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--compile", action="store_true", help="part ac: compile each block")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    args.tokens = [int(t) for t in args.tokens.split(",") if t]
    refuse_held_results(args.out)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("llm_train_features: no CUDA device (pass --device cpu for a smoke run)", file=sys.stderr)
        return 2
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    rows: list[dict] = []
    if "ce" in parts:
        rows += ce_rows(args, device)
    if "ac" in parts:
        rows += ac_rows(args, device)
    config = {k: v for k, v in vars(args).items() if k != "out"} | {"out": str(args.out), "device": str(device)}
    sections = [("Cross-entropy kernels (forward + backward, bf16 autocast, fp32 masters)",
                 [r for r in rows if r["part"] == "ce"], CE_COLUMNS),
                ("Activation checkpointing (forward + backward, chunked loss)",
                 [r for r in rows if r["part"] == "ac"], AC_COLUMNS)]
    path = write_results(args.out, env=collect_env(), config=config, results=rows, columns=CE_COLUMNS,
                         title="LLM training features", command=" ".join(["python", *sys.argv]), sections=sections)
    print(path.with_suffix(".md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
