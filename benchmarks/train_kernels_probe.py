"""kiln's training kernels against what inductor generates, alone, on one GPU: the SwiGLU
(`training.swiglu_kernel=fused`, kiln.train.swiglu) and the cross-entropy on the logits
(`training.ce_kernel=triton`, kiln.kernels.triton_ce), at the Llama-3.2-1B step's shapes.

Each case times forward + backward (kiln.timing.measure_interleaved: 10 queued calls a sample,
synchronized, cases taken round-robin, medians), and each of kiln's kernels alone under a few launch configurations (BLOCK, num_warps),
and converts the time to bytes per second against the minimum traffic of the work (SwiGLU: 16
bytes per h element in bf16, forward 6 + backward 10; cross-entropy: 3 passes over the bf16
logits, forward 2 + backward 4 bytes per logit) and against a copy measured in the same process.
It also checks kiln's results against PyTorch's.

    python benchmarks/train_kernels_probe.py --tokens 16384 --out $OUT/train_kernels_probe.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from kiln.kernels.triton_ce import triton_cross_entropy
from kiln.timing import measure_interleaved
from kiln.train.swiglu import swiglu

REPS = 10  # calls per timed sample, queued back to back: the host's launch work hides behind the GPU's


def _interleaved(cases: dict, rounds: int, warmup: int, device) -> dict[str, dict]:
    """Milliseconds per call of each case: kiln.timing's round-robin timer, REPS calls a sample."""
    timed = measure_interleaved(cases, warmup=warmup, repeats=rounds, calls_per_sample=REPS, device=device)
    return {k: {**t.as_dict(per=REPS), "min_ms": min(t.samples_s) * 1e3 / REPS,
                "max_ms": max(t.samples_s) * 1e3 / REPS} for k, t in timed.items()}


# (BLOCK, num_warps) tried per kernel; the first is the one kiln ships.
SWIGLU_CONFIGS = [(4096, 8), (1024, 4), (2048, 8)]
CE_FWD_CONFIGS = [(8192, 8), (4096, 8)]
CE_BWD_CONFIGS = [(8192, 8), (2048, 4)]


def _swiglu_ref(gu):
    gate, up = gu.chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu_cases(tokens: int, inner: int, device) -> tuple[dict, dict]:
    gu = torch.randn(tokens, 2 * inner, device=device, dtype=torch.bfloat16).requires_grad_(True)
    dh = torch.randn(tokens, inner, device=device, dtype=torch.bfloat16)
    inductor = torch.compile(_swiglu_ref)
    kiln_compiled = torch.compile(swiglu)

    def run(fn):
        def go():
            gu.grad = None
            fn(gu).backward(dh)
        return go

    n = tokens * inner
    cases = {"swiglu_inductor": (run(inductor), 16 * n), "swiglu_kiln": (run(swiglu), 16 * n),
             "swiglu_kiln_compiled": (run(kiln_compiled), 16 * n)}
    from kiln.kernels import swiglu_kernel as sk

    g0 = gu.detach()

    def config(fn, block, warps):
        def go():
            sk.BLOCK, sk.NUM_WARPS = block, warps
            fn()
        return go

    for block, warps in SWIGLU_CONFIGS:
        cases[f"swiglu_fwd_kernel_b{block}_w{warps}"] = (config(lambda: sk.swiglu_forward(g0), block, warps), 6 * n)
        cases[f"swiglu_bwd_kernel_b{block}_w{warps}"] = (config(lambda: sk.swiglu_backward(g0, dh), block, warps),
                                                         10 * n)
    # correctness at full size against eager PyTorch (bf16 results: count elements off by > 1 ulp)
    g1 = gu.detach().clone().requires_grad_(True)
    ref = _swiglu_ref(g1)
    ref.backward(dh)
    g2 = gu.detach().clone().requires_grad_(True)
    got = swiglu(g2)
    got.backward(dh)
    check = {"swiglu_fwd_max_abs_diff": (got.float() - ref.float()).abs().max().item(),
             "swiglu_fwd_frac_exact": (got == ref).float().mean().item(),
             "swiglu_bwd_max_abs_diff": (g2.grad.float() - g1.grad.float()).abs().max().item(),
             "swiglu_bwd_frac_exact": (g2.grad == g1.grad).float().mean().item()}
    return cases, check


def ce_cases(tokens: int, vocab: int, device) -> tuple[dict, dict]:
    x = (torch.randn(tokens, vocab, device=device) * 2).to(torch.bfloat16).requires_grad_(True)
    t = torch.randint(0, vocab, (tokens,), device=device)
    t[::97] = -100
    inductor = torch.compile(lambda x, t: F.cross_entropy(x, t))
    kiln_compiled = torch.compile(triton_cross_entropy)

    def run(fn):
        def go():
            x.grad = None
            fn(x, t).backward()
        return go

    n = tokens * vocab
    cases = {"ce_inductor": (run(inductor), 6 * n), "ce_kiln": (run(triton_cross_entropy), 6 * n),
             "ce_kiln_compiled": (run(kiln_compiled), 6 * n)}
    from kiln.kernels import triton_ce_kernel as ck

    x0 = x.detach()
    lse = ck.ce_forward(x0, t)[1]
    g = torch.full((tokens,), 1.0 / tokens, device=device)

    def fwd(block, warps):
        def go():
            ck.FWD_BLOCK, ck.FWD_WARPS = block, warps
            ck.ce_forward(x0, t)
        return go

    def bwd(block, warps):
        def go():
            ck.BWD_BLOCK, ck.BWD_WARPS = block, warps
            ck.ce_backward(x0, t, lse, g)
        return go

    for block, warps in CE_FWD_CONFIGS:
        cases[f"ce_fwd_kernel_b{block}_w{warps}"] = (fwd(block, warps), 2 * n)
    for block, warps in CE_BWD_CONFIGS:
        cases[f"ce_bwd_kernel_b{block}_w{warps}"] = (bwd(block, warps), 4 * n)
    rows = 512  # the fp32 reference on a slice (the full one needs 4 copies of the logits in fp32)
    xs = x.detach()[:rows].clone().requires_grad_(True)
    ref = F.cross_entropy(xs.float(), t[:rows])
    ref.backward()
    xk = x.detach()[:rows].clone().requires_grad_(True)
    got = triton_cross_entropy(xk, t[:rows])
    got.backward()
    check = {"ce_loss_abs_diff": abs(got.item() - ref.item()),
             "ce_grad_max_abs_diff": (xk.grad.float() - xs.grad.float().to(torch.bfloat16).float()).abs().max().item(),
             "ce_grad_max_abs": xs.grad.abs().max().item()}
    return cases, check


def copy_rate_tb_s(device) -> float:
    """Bytes read plus written per second (TB/s) by a copy of 2 GiB into another 2 GiB."""
    src = torch.empty(2**29, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy = _interleaved({"copy": lambda: dst.copy_(src)}, 20, 3, device)["copy"]
    return 2 * src.numel() * 4 / (copy["median_ms"] * 1e-3) / 1e12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--inner", type=int, default=8192, help="SwiGLU width (Llama-3.2-1B: 8192)")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    device = torch.device("cuda")
    copy_tbs = copy_rate_tb_s(device)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": args.tokens,
              "copy_tb_s": copy_tbs, "cases": {}, "checks": {}}
    for make, size in ((swiglu_cases, args.inner), (ce_cases, args.vocab)):
        cases, check = make(args.tokens, size, device)
        timed = _interleaved({k: fn for k, (fn, _) in cases.items()}, args.rounds, 2, device)
        for name, v in timed.items():
            v["min_bytes"] = cases[name][1]
            v["tb_s_of_min_traffic"] = v["min_bytes"] / (v["median_ms"] * 1e-3) / 1e12
            v["share_of_copy"] = v["tb_s_of_min_traffic"] / copy_tbs
        result["cases"].update(timed)
        result["checks"].update(check)
        del cases
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
