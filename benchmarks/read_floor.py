"""The read floor of a batch-1 decode step's structure: how long the GPU takes to read the bytes
the step reads when they are read as the step reads them, one kernel per projection and per
layer's attention, back to back; against the same bytes read by one kernel (the streaming ceiling
the bench reports).

Why: a batch-1 decode step of a 3B model is 141 kernels, and int4's are small (wo's weight is
5 MB, read in about a microsecond at full bandwidth), so each kernel's ramp-up and drain weigh on
the step. This measures what that structure costs with nothing but reads: a kernel per read that
only streams its bytes (kiln.kernels.stream_read's xor reduction), so a decode kernel can be
judged against the floor of its own kernel count, and the rest of the gap to the streaming ceiling
is what fewer, larger kernels could win.

The reads, per layer in order: wqkv, the layer's keys and values over `--slots` slots, wo,
w_gate_up, w_down; then lm_head. Weights as the decode step stores them: bf16, or int4 in kiln's
layout (int32 words of eight nibbles, a scale and an offset in the model dtype per group of 128
inputs and output). Each read has a buffer of its own (the whole step's bytes, so no read is an L2
hit). Per read kind the block size of the read kernel is the fastest of a few, timed alone. Then
per weight format, as CUDA graphs replayed interleaved (median ms per step):

- `one read`: all the step's bytes in one buffer, one kernel;
- `a kernel per read`: the step's reads, kernel after kernel;
- `a kernel per read, PDL`: the same, each kernel launched while the one before ends, its loads
  issued before it waits for that one (programmatic dependent launch, as kiln's decode kernels do).

    python benchmarks/read_floor.py --out DIR [--model llama-3.2-3b] [--slots 576] [--quant none,int4]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

GROUP = 128
BLOCKS = (512, 1024, 2048, 4096)
"""64-bit words per program the read kernel may use (4-32 KiB)."""


@dataclass(frozen=True)
class Read:
    kind: str
    """`attn.wqkv`, `kv`, ..., `lm_head`."""
    nbytes: int


def weight_bytes(out_f: int, in_f: int, quant: str, dtype_bytes: int) -> int:
    """Bytes of one projection's weight as the decode step reads it: bf16 (`none`), or int4 in kiln's
    layout (in_f x out_f / 2 bytes of words, a scale and an offset per group of GROUP inputs and output)."""
    from kiln.bench.formulas import int4_weight_bytes

    if quant == "none":
        return out_f * in_f * dtype_bytes
    return int4_weight_bytes(out_f, in_f, GROUP, dtype_bytes)


def step_reads(config, quant: str, slots: int, dtype_bytes: int = 2) -> list[Read]:
    """The reads of one batch-1 decode step, in order (norm weights and the embedding row left out)."""
    from kiln.llm.llama_family import projections

    shapes = projections(config)
    kv = Read("kv", 2 * config.n_kv_heads * config.head_dim * dtype_bytes * slots)
    layer = [Read("attn.wqkv", weight_bytes(*shapes["attn.wqkv"], quant, dtype_bytes)), kv,
             Read("attn.wo", weight_bytes(*shapes["attn.wo"], quant, dtype_bytes)),
             Read("ffn.w_gate_up", weight_bytes(*shapes["ffn.w_gate_up"], quant, dtype_bytes)),
             Read("ffn.w_down", weight_bytes(*shapes["ffn.w_down"], quant, dtype_bytes))]
    return layer * config.n_layers + [Read("lm_head", weight_bytes(config.vocab_size, config.dim, quant, dtype_bytes))]


@functools.cache
def _kernels():
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    @triton.jit
    def read_pdl(src, out, n_words, BLOCK: tl.constexpr):
        """kiln.kernels.stream_read's read, with its loads issued before waiting for the kernel before."""
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        words = tl.load(src + offs, mask=offs < n_words, other=0)
        gdc_wait()
        gdc_launch_dependents()
        tl.store(out + pid, tl.xor_sum(words, 0))

    return read_pdl


def reader(buf: torch.Tensor, block: int, pdl: bool):
    """A callable reading all of `buf` (bytes, a multiple of 8) with programs of `block` words."""
    from kiln.kernels.stream_read import triton_read

    if not pdl:
        return triton_read(buf, block=block, warps=8)
    kernel = _kernels()
    words = buf.view(torch.int64)
    programs = -(-words.numel() // block)
    out = torch.empty(programs, dtype=torch.int64, device=buf.device)
    return lambda: kernel[(programs,)](words, out, words.numel(), BLOCK=block, num_warps=8, launch_pdl=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-3.2-3b")
    ap.add_argument("--slots", type=int, default=576,
                    help="key/value slots each layer's attention reads (default: prompt 512 + half of 128 new tokens)")
    ap.add_argument("--quant", default="none,int4", help="weight formats, comma-separated: none (bf16), int4")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    quants = args.quant.split(",")
    if any(q not in ("none", "int4") for q in quants):
        print(f"read_floor: --quant: {args.quant!r}: choose from none, int4", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("read_floor: needs a CUDA device", file=sys.stderr)
        return 2
    from kiln.bench.results import write_results
    from kiln.llm.config import resolve_model
    from kiln.monitor.env import collect_env
    from kiln.timing import cuda_graph_of, replay_rounds

    config = resolve_model(args.model).config
    dev = torch.device("cuda")
    results, graphs, meta, alive = [], {}, {}, []
    for quant in quants:
        reads = step_reads(config, quant, args.slots)
        buffers = [torch.randint(-2**31, 2**31 - 1, (2 * -(-r.nbytes // 8),), dtype=torch.int32, device=dev)
                   .view(torch.uint8) for r in reads]  # whole 64-bit words (the read kernel's unit)
        alive.append(buffers)
        best: dict[str, int] = {}
        for kind in dict.fromkeys(r.kind for r in reads):  # each kind's block, its reads alone back to back
            mine = [b for r, b in zip(reads, buffers, strict=True) if r.kind == kind]
            # Each reader's output lives outside the graph: kept alive here, or a later capture's
            # empty_cache() frees it under the graph that writes it.
            readers = {block: [reader(b, block, False) for b in mine] for block in BLOCKS}
            alive.append(readers)
            alone = {block: cuda_graph_of(lambda fs=fs: [f() for f in fs], 1) for block, fs in readers.items()}
            times = {block: statistics.median(ms) / len(mine) for block, ms in replay_rounds(alone, 7).items()}
            best[kind] = min(times, key=times.get)
            nbytes = next(r.nbytes for r in reads if r.kind == kind)
            results.append({"quant": quant, "what": kind, "bytes": nbytes, "kernels": len(mine), "block": best[kind],
                            "us": times[best[kind]] * 1e3, "gb_per_s": nbytes / times[best[kind]] / 1e6,
                            "status": "ok"})
        whole = torch.cat(buffers)
        alive.append(whole)
        for variant, fns in (("one read", [reader(whole, 4096, False)]),
                             ("a kernel per read", [reader(b, best[r.kind], False) for r, b in zip(reads, buffers, strict=True)]),
                             ("a kernel per read, PDL", [reader(b, best[r.kind], True) for r, b in zip(reads, buffers, strict=True)])):
            alive.append(fns)
            graphs[(quant, variant)] = cuda_graph_of(lambda fns=fns: [f() for f in fns], 1)
            meta[(quant, variant)] = {"bytes": sum(r.nbytes for r in reads), "kernels": len(fns)}
        print(f"{quant}: {len(reads)} reads, {sum(r.nbytes for r in reads) / 1e9:.3f} GB: ready", flush=True)
    for (quant, variant), ms in replay_rounds(graphs, args.repeats).items():
        step = statistics.median(ms)
        results.append({"quant": quant, "what": f"step: {variant}", "bytes": meta[(quant, variant)]["bytes"],
                        "kernels": meta[(quant, variant)]["kernels"], "us": step * 1e3,
                        "us_p10": sorted(ms)[len(ms) // 10] * 1e3, "us_p90": sorted(ms)[(9 * len(ms)) // 10] * 1e3,
                        "gb_per_s": meta[(quant, variant)]["bytes"] / step / 1e6, "status": "ok"})
    write_results(args.out, env=collect_env(), config={"model": args.model, "slots": args.slots, "repeats": args.repeats},
                  results=results, columns=["quant", "what", "bytes", "kernels", "block", "us", "gb_per_s"],
                  title=f"Read floor of a batch-1 decode step's structure ({args.model}, {args.slots} slots)",
                  command="python " + " ".join(sys.argv))
    print((Path(args.out) / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
