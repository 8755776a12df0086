"""Microbenchmark of one decode step's attention on a GPU: the matmul path (compiled as the engine
compiles it), FlashAttention's varlen kernel and kiln's Triton kernel over a sweep of its launch
settings (slots per block, programs aimed at, warps, the looping programs' pipeline stages and TMA reads, whether chunks split
each row's valid range evenly), on one layer of a model's shape.

Each variant is captured as back-to-back calls in one CUDA graph (as in a decode step: no launch
gaps from the host), at least `--layers` of them and each on its own copy of the keys and values,
enough copies that one replay reads 3x the L2 cache (kiln.bench.rotation; a layer's K/V would
otherwise be read from L2 after the first replay, which a model's 28 layers never are). Replayed
`--repeats` times; a variant's figure is the median us per call and the GB/s of the keys and
values it reads. Rounds interleave the variants. Writes results.json and results.md under --out.

    python benchmarks/decode_attention_bench.py --out DIR [--model llama-3.2-3b] [--slots 1280] [--batch 32 --used 512,640]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

from kiln.bench.rotation import copies_beyond_l2, l2_bytes
from kiln.llm.config import resolve_model
from kiln.llm.decode_attention import flash_decode, varlen_rows
from kiln.llm.engine import default_inductor_options
from kiln.llm.model import Attention
from kiln.timing import cuda_graph_of, replay_rounds


def attn_inv_freq(config, dev):
    """The RoPE frequencies [D / 2] (fp32) the fused op rotates with (kiln.llm.rope's)."""
    from kiln.llm.rope import inv_frequencies

    return inv_frequencies(config.rope, config.head_dim, dev).float()


def attend(q, k, v, pad, pos, scale):
    """kiln's decode attention op on q [B, 1, H, D] -> [B, 1, H, D], as kiln's decode layer calls it."""
    B, _, H, D = q.shape
    return torch.ops.kiln.decode_attention(q.reshape(B, H, D), k, v, pad, pos, scale, 0).view(B, 1, H, D)


def attend_rope(qkv, inv_freq, k, v, pad, pos, scale, heads: int):
    """kiln's fused RoPE, cache write and attention op on the projection's output qkv [B, 1, (H + 2 Hkv) D]
    -> [B, 1, heads, D], as kiln's decode layer calls it."""
    B, D = qkv.shape[0], k.shape[-1]
    return torch.ops.kiln.decode_attention_rope(qkv.reshape(B, -1), inv_freq, k, v, pad, pos, scale, 0,
                                                heads).view(B, 1, heads, D)


def rows_used(spec: str | None, batch: int, slots: int) -> list[int] | None:
    """The slots each row attends: all of them without `spec`; with MIN,MAX spread evenly from MIN to
    MAX over the rows; None when `spec` is not such a pair within 1 .. slots."""
    if not spec:
        return [slots] * batch
    parts = spec.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        return None
    low, high = int(parts[0]), int(parts[1])
    if not 1 <= low <= high <= slots:
        return None
    return [low + (high - low) * b // max(batch - 1, 1) for b in range(batch)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-3.2-3b")
    ap.add_argument("--slots", type=int, default=1280, help="cache capacity; the step attends over all of it")
    ap.add_argument("--layers", type=int, default=28,
                    help="calls per graph replay, at least (more where 3x the L2 cache needs more K/V copies)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--batch", type=int, default=1, help="rows attending at once (each over all --slots)")
    ap.add_argument("--used", default=None, help="MIN,MAX: row b attends only its last n_b slots, n_b spread evenly "
                    "from MIN to MAX over the rows (left padding, as a server's rows ending at the step's slot); "
                    "GB/s then counts the slots the rows use. Default: every row uses all --slots")
    ap.add_argument("--blocks", default="16,32,64", help="slots per block to sweep")
    ap.add_argument("--targets", default="128,256,512,1024", help="programs aimed at, to sweep")
    ap.add_argument("--warps", default="2,4", help="warps per program, to sweep")
    ap.add_argument("--stages", default="0", help="LOOP_STAGES to sweep (0: the hand-prefetched loop; N: Triton's "
                    "pipeline with N stages, where a program loops)")
    ap.add_argument("--tma", default="0", help="TMA to sweep, with --stages > 0 (1: the pipelined loop reads keys "
                    "and values through Hopper's tensor memory accelerator, e.g. --stages 3,4 --tma 0,1)")
    ap.add_argument("--balance", default="0", help="BALANCE to sweep (0: a looping program walks its fixed slice of "
                    "the cache; 1: each chunk an even share of its row's valid range, e.g. --balance 0,1)")
    ap.add_argument("--rope", action="store_true", help="also the fused RoPE + cache write + attention op "
                    "(kiln::decode_attention_rope, what a Llama decode step runs) at each launch setting")
    args = ap.parse_args(argv)
    used = rows_used(args.used, args.batch, args.slots)
    if used is None:
        print(f"decode_attention_bench: --used {args.used}: need MIN,MAX with 1 <= MIN <= MAX <= --slots "
              f"({args.slots})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("decode_attention_bench: needs a CUDA device", file=sys.stderr)
        return 2
    import kiln.kernels.triton_decode as td

    # kiln's own choice: the module's defaults, read before the sweep changes them
    default_target, default_balance, default_tma = td.TARGET_PROGRAMS, td.BALANCE, td.TMA
    default_stages = td.LOOP_STAGES

    config = resolve_model(args.model).config
    B, S, H, Hkv, D = args.batch, args.slots, config.n_heads, config.n_kv_heads, config.head_dim
    dev, dtype = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, 1, H, D, device=dev, dtype=dtype, generator=gen)
    kv_bytes = 2 * sum(used) * Hkv * D * q.element_size()  # what the rows attend over
    calls = max(args.layers, copies_beyond_l2(2 * B * S * Hkv * D * q.element_size(), l2_bytes(dev)))
    kvs = [(torch.randn(B, S, Hkv, D, device=dev, dtype=dtype, generator=gen),
            torch.randn(B, S, Hkv, D, device=dev, dtype=dtype, generator=gen)) for _ in range(calls)]
    k, v = kvs[0]
    pos = torch.tensor([S - 1], device=dev)
    pad = torch.tensor([S - n for n in used], dtype=torch.long, device=dev)
    mask = torch.arange(S, device=dev)[None, :] >= pad[:, None]
    scale = D ** -0.5
    attn = Attention(config, None).to(dev, dtype)

    matmul = torch.compile(lambda k, v: attn._decode_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                               mask), fullgraph=True, options=default_inductor_options(dev))
    rows = varlen_rows(B, S, pos, pad)
    # Every variant takes one (k, v) copy and returns [B, 1, H, D]: the matmul path gives [B, H, 1, D]
    # (a view transposes it).
    variants = {"matmul (compiled)": lambda k, v: matmul(k, v).transpose(1, 2),
                "flash": lambda k, v: flash_decode(q, k, v, rows, scale)}
    with torch.no_grad():  # the reference: the matmul path in eager, in fp32
        reference = Attention._decode_attention(attn, q.float().transpose(1, 2), k.float().transpose(1, 2),
                                                v.float().transpose(1, 2), mask).transpose(1, 2)
    settings = {}
    ints = lambda text: [int(t) for t in text.split(",")]  # noqa: E731
    for block, target, warps, stages, balance, tma in itertools.product(ints(args.blocks), ints(args.targets),
                                                                        ints(args.warps), ints(args.stages),
                                                                        ints(args.balance), ints(args.tma)):
        if (stages and balance) or (tma and not stages):
            continue  # BALANCE applies to the hand-prefetched loop only, TMA to the pipelined one
        name = (f"triton block {block} target {target} warps {warps}" + (f" stages {stages}" if stages else "")
                + (" tma" if tma else "") + (" balanced" if balance else ""))
        settings[name] = (block, target, warps, stages, balance, tma)

        def run(k, v, block=block, target=target, warps=warps, stages=stages, balance=balance, tma=tma):
            td.BLOCK_S, td.TARGET_PROGRAMS, td.NUM_WARPS, td.LOOP_STAGES = block, target, warps, stages or None
            td.BALANCE, td.TMA = bool(balance), bool(tma)
            return attend(q, k, v, pad, pos, scale)

        variants[name] = run
        if args.rope and name == next(iter(settings)):  # once: kiln's own choice (launch_settings)
            qkv0 = torch.randn(B, 1, (H + 2 * Hkv) * D, device=dev, dtype=dtype, generator=gen)

            def run_auto(k, v, qkv=qkv0, inv_freq=attn_inv_freq(config, dev)):
                td.BLOCK_S, td.TARGET_PROGRAMS, td.NUM_WARPS, td.LOOP_STAGES = None, default_target, None, default_stages
                td.BALANCE, td.TMA = default_balance, default_tma
                return attend_rope(qkv, inv_freq, k, v, pad, pos, scale, H)

            variants["rope kiln's choice " + "/".join(map(str, td.launch_settings(B, Hkv, S)))] = run_auto
        if args.rope:  # the projection's output, rotated and written into the cache by the kernel itself
            qkv = torch.randn(B, 1, (H + 2 * Hkv) * D, device=dev, dtype=dtype, generator=gen)
            inv_freq = attn_inv_freq(config, dev)
            settings[f"rope {name}"] = (block, target, warps, stages, balance, tma)

            def run_rope(k, v, block=block, target=target, warps=warps, stages=stages, balance=balance, tma=tma,
                         qkv=qkv, inv_freq=inv_freq):
                td.BLOCK_S, td.TARGET_PROGRAMS, td.NUM_WARPS, td.LOOP_STAGES = block, target, warps, stages or None
                td.BALANCE, td.TMA = bool(balance), bool(tma)
                return attend_rope(qkv, inv_freq, k, v, pad, pos, scale, H)

            variants[f"rope {name}"] = run_rope
    errors = {}
    for name, fn in variants.items():  # every error before any graph: the rope variants (and their graphs'
        # warm-up calls, over every copy) write the step's slot, which would change the reference's cache
        out = fn(k.clone(), v.clone()).float()
        out = fn(k.clone(), v.clone()).float()  # a second call too: the first of a compiled variant also tunes it
        errors[name] = float((out - reference).abs().max()) if not name.startswith("rope") else None
    graphs = {name: cuda_graph_of(lambda fn=fn: [fn(*kv) for kv in kvs], 1) for name, fn in variants.items()}
    times = {name: [ms * 1000 / calls for ms in samples]
             for name, samples in replay_rounds(graphs, args.repeats).items()}
    results = []
    for name, samples in times.items():
        us = statistics.median(samples)
        row = {"variant": name, "us_per_call": us, "kv_gb_per_s": kv_bytes / us / 1e3,
               "max_abs_vs_eager_fp32": errors[name]}
        if name in settings:
            block, target, warps, stages, balance, tma = settings[name]
            td.TARGET_PROGRAMS = target
            row.update(block=block, target=target, warps=warps, stages=stages, balance=balance, tma=tma,
                       chunks=td.chunking(B, Hkv, S, block)[1])
        results.append(row)
    results.sort(key=lambda r: r["us_per_call"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"model": args.model, "batch": B, "slots": S, "used": args.used, "used_slots": sum(used), "heads": H, "kv_heads": Hkv, "head_dim": D,
            "calls_per_replay": calls, "kv_copies": calls, "l2_bytes": l2_bytes(dev), "repeats": args.repeats, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(), "kv_bytes_per_call": kv_bytes}
    (out / "results.json").write_text(json.dumps({"config": meta, "results": results}, indent=2) + "\n")
    rows_use = f", rows using {args.used.replace(',', '-')} of them" if args.used else ""
    lines = [f"# Decode attention, one layer: {args.model} shape, batch {B}, {S} slots{rows_use}, bf16, {meta['gpu']}", "",
             "| variant | us/call | K+V GB/s | max abs vs eager fp32 |", "|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['us_per_call']:.2f} | {r['kv_gb_per_s']:.0f} | "
              f"{'-' if r['max_abs_vs_eager_fp32'] is None else format(r['max_abs_vs_eager_fp32'], '.3g')} |"
              for r in results]
    lines += ["", f"Command: `python {' '.join(sys.argv)}`; torch {torch.__version__}."]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
