"""Microbenchmark of training attention on a GPU: forward + backward of causal SDPA for one layer of a
model's shape, per kernel SDPA can run (flash, cuDNN, memory-efficient), with grouped-query
attention passed natively (`enable_gqa`) and with the key/value heads repeated, as
`model.attention` would run it. The figures behind that key's default: which kernel trains the
shape fastest.

Each variant's call is one forward and one backward (gradients of q, k and v) on its own tensors;
variants are timed round-robin (kiln.timing.measure_interleaved) after a warm-up, and a row's
figure is the median ms per call, its p10-p90, and TFLOP/s of the causal half counted as flash
attention's papers count it (kiln.bench.formulas.causal_attention_flops). Outputs and gradients are
compared with the first kernel that runs (max abs difference). A kernel SDPA refuses for the shape
is a `skipped` row with SDPA's reason.

    python benchmarks/attention_train_bench.py --out DIR [--model llama-3.1-8b] [--seq-len 8192]
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from kiln.bench.formulas import causal_attention_flops, tflops
from kiln.bench.gpu_specs import table_flops
from kiln.bench.results import write_results
from kiln.llm.config import resolve_model
from kiln.monitor.env import collect_env
from kiln.timing import measure_interleaved

KERNELS = ("flash", "cudnn", "efficient")


def backend(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]


def make_call(kernel: str, native_gqa: bool, shape: tuple[int, int, int, int, int], dev: torch.device):
    """A forward + backward closure on fresh tensors, and the tensors it writes (out, dq, dk, dv)."""
    from torch.nn.attention import sdpa_kernel

    batch, heads, kv_heads, seq, dim = shape
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(batch, heads, seq, dim, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
    kv = [torch.randn(batch, kv_heads, seq, dim, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
          for _ in range(2)]
    grad = torch.randn(batch, heads, seq, dim, device=dev, dtype=torch.bfloat16, generator=gen)
    groups = heads // kv_heads
    keep = {}

    def call():
        k, v = kv if native_gqa else [t.repeat_interleave(groups, dim=1) for t in kv]
        with sdpa_kernel([backend(kernel)]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=native_gqa and groups > 1)
        q.grad = None
        for t in kv:
            t.grad = None
        out.backward(grad)
        keep.update(out=out.detach(), dq=q.grad, dk=kv[0].grad, dv=kv[1].grad)

    return call, keep


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--seq-len", default="8192", help="comma-separated")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    kernels = args.kernels.split(",")
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown:
        print(f"attention_train_bench: --kernels: unknown {unknown}; choose from {', '.join(KERNELS)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("attention_train_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    cfg = resolve_model(args.model).config
    dev = torch.device("cuda")
    peak = table_flops(torch.cuda.get_device_name(), "bf16")
    rows = []
    for seq in (int(s) for s in args.seq_len.split(",")):
        shape = (args.batch, cfg.n_heads, cfg.n_kv_heads, seq, cfg.head_dim)
        calls, kept, refused = {}, {}, {}
        for kernel in kernels:
            for native in (True, False):
                name = (kernel, native)
                call, keep = make_call(kernel, native, shape, dev)
                try:
                    call()
                    torch.cuda.synchronize()
                except RuntimeError as err:
                    refused[name] = str(err).splitlines()[0][:160]
                    continue
                calls[name], kept[name] = call, keep
        timings = measure_interleaved(calls, warmup=3, repeats=args.repeats, device=dev) if calls else {}
        flops = causal_attention_flops(batch=args.batch, heads=cfg.n_heads, seq_len=seq, head_dim=cfg.head_dim,
                                       backward=True)
        ref = next(iter(kept.values()), None)
        for name, timing in timings.items():
            diff = max(float((kept[name][t].float() - ref[t].float()).abs().max()) for t in ref)
            secs = timing.median_s
            rows.append({"seq_len": seq, "kernel": name[0], "gqa": "native" if name[1] else "repeated",
                         "status": "ok", "ms": secs * 1e3, "p10_ms": timing.quantile_s(0.1) * 1e3,
                         "p90_ms": timing.quantile_s(0.9) * 1e3, "tflops": tflops(flops, secs),
                         "of_datasheet": flops / secs / peak if peak else None, "max_abs_diff": diff})
        for name, why in refused.items():
            rows.append({"seq_len": seq, "kernel": name[0], "gqa": "native" if name[1] else "repeated",
                         "status": "skipped", "reason": why})
        fastest = min((r["ms"] for r in rows if r["seq_len"] == seq and r["status"] == "ok"), default=None)
        for r in rows:
            if r["seq_len"] == seq and r["status"] == "ok":
                r["vs_fastest"] = r["ms"] / fastest
    cols = ["seq_len", "kernel", "gqa", "status", "ms", "p10_ms", "p90_ms", "tflops", "of_datasheet", "vs_fastest",
            "max_abs_diff", "reason"]
    write_results(args.out, env=collect_env(), config={**vars(args), "heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads,
                                                       "head_dim": cfg.head_dim, "datasheet_bf16_flops": peak},
                  results=rows, columns=cols, command="python " + " ".join(sys.argv),
                  title=f"Training attention, forward + backward, {args.model} (one layer, batch {args.batch})")
    for r in rows:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
