"""What kiln's decode attention kernel (or, with --int4, int4@triton's one-row kernel) costs an SM,
per launch setting, without a GPU: the kernel is compiled for an H100/H200 (sm_90) on this machine
(Triton's frontend, its NVIDIA passes and the ptxas and cuobjdump it ships run on a CPU) and the
cubin's registers per thread, stack (spilled registers) and shared memory are read back. Registers
and shared memory decide how many programs an SM holds at once, so how many tiles are in flight:
a setting to try on a GPU is one that holds more of them. `--int4-rows M` does the same for
int4@triton's row kernel at M rows, with the weight as the products' first operand (SWAP) and
without. The pointers and the strides that are multiples of 16 at a real launch
are marked so (as Triton's launcher marks them), or the compiler plans unaligned loads.

    python benchmarks/kernel_resources.py --out DIR [--batch 1,16,32] [--slots 1024] [--blocks 32,64]
        [--stages 0,3] [--warps 4] [--no-rope]
    python benchmarks/kernel_resources.py --out DIR --int4
    python benchmarks/kernel_resources.py --out DIR --int4-rows 16
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shlex
import subprocess
import sys
import tempfile
from typing import Any

POINTERS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Start": "*i64", "Pos": "*i64", "Part": "*fp32",
            "Lse": "*fp32", "Arrived": "*i32", "Y": "*bf16", "InvFreq": "*fp32"}
"""kiln.kernels.triton_decode._chunk_attention's pointer arguments on a bf16 model."""


def compile_sm90(fn: Any, types: dict[str, str], constexprs: dict[str, Any], num_warps: int,
                 divisible: tuple[str, ...] = (), num_stages: int = 2) -> Any:
    """The kernel `fn` (a triton.jit function) compiled for sm_90: `types` gives every runtime
    argument's Triton type ('*bf16', 'i32', 'fp32', 'tensordesc<bf16[64, 128]>'), `constexprs` the
    rest; the arguments in `divisible` are marked multiples of 16 (aligned pointers, strides).
    ImportError where this Triton has no NVIDIA backend."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import compiler  # noqa: F401  (the backend, with its ptxas)
    from triton.compiler import ASTSource

    names = fn.arg_names
    missing = [n for n in names if n not in types and n not in constexprs]
    if missing:
        raise ValueError(f"no type or value for {missing}")
    signature = {n: types.get(n, "constexpr") for n in names}
    values = {(names.index(n),): v for n, v in constexprs.items()}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    return triton.compile(ASTSource(fn, signature, values, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def usage(compiled: Any) -> dict[str, int]:
    """Registers per thread and stack bytes (cuobjdump -res-usage on the cubin), and the shared
    memory a launch asks for (static and the pipeline's, Triton's metadata)."""
    from triton.backends.nvidia import compiler

    tool = os.path.join(os.path.dirname(compiler.__file__), "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernel.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        text = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    if found is None:
        raise RuntimeError(f"cuobjdump -res-usage gave no REG/STACK line: {text[:200]!r}")
    return {"registers": int(found[1]), "stack_bytes": int(found[2]), "shared_bytes": int(compiled.metadata.shared)}


def decode_attention(td: Any, *, batch: int, slots: int, kv_heads: int, group: int, head_dim: int,
                     stages: int | None, rope: bool, tma: bool = False, balance: bool = False,
                     pdl: bool | None = None) -> tuple[Any, tuple]:
    """kiln.kernels.triton_decode's kernel compiled as `_launch` would launch it for this shape and
    the module's settings (LOOP_BLOCK, ...; `stages` sets LOOP_STAGES; `pdl` the PDL constant, by
    default `rope`); returns (compiled, launch_settings)."""
    import triton

    td.LOOP_STAGES = stages
    block, per_chunk, chunks, warps = td.launch_settings(batch, kv_heads, slots)
    kernel = td._kernel()
    ints = [n for n in kernel.arg_names if n.startswith("stride") or n in ("slots", "window", "kv_heads")]
    desc = f"tensordesc<bf16[{block}, {head_dim}]>" if tma else "*bf16"
    types = {**{n: "i32" for n in ints}, **POINTERS, "Kd": desc, "Vd": desc, "scale": "fp32"}
    looping = per_chunk > block
    constexprs = dict(G=group, BLOCK_G=max(16, triton.next_power_of_2(group)), D=head_dim,
                      BLOCK_D=triton.next_power_of_2(head_dim), CHUNK=per_chunk, CHUNKS=chunks,
                      BLOCK_C=triton.next_power_of_2(chunks), BLOCK=block, HAS_START=True, ROPE=rope,
                      PDL=rope if pdl is None else pdl,
                      STAGES=(stages or 0) if looping else 0, BALANCE=balance and looping, TMA=tma and looping)
    aligned = tuple(POINTERS) + tuple(n for n in ints if n.startswith("stride") or n == "slots")
    return compile_sm90(kernel, types, constexprs, warps, aligned), (block, per_chunk, chunks, warps)


INT4_3B = {"wqkv": (5120, 3072, "rms", False, False), "wo": (3072, 3072, "none", False, True),
           "w_gate_up": (16384, 3072, "rms", True, False), "w_down": (3072, 8192, "none", False, True),
           "lm_head": (128256, 3072, "rms", False, False)}
"""Llama-3.2-3B's projections as int4@triton runs them at one row: (N, K, prologue, SWIGLU epilogue,
residual add); the norms folded into the weights, w_gate_up's rows gate and up interleaved."""


INT4_TYPES = {"X": "*bf16", "Q": "*i32", "Scale": "*bf16", "Offset": "*bf16", "Y": "*bf16", "NormW": "*bf16",
              "Bias": "*bf16", "Res": "*bf16", "Part": "*fp32", "Arrived": "*i32", "N": "i32", "eps": "fp32",
              "stride_xm": "i32", "stride_ym": "i32", "stride_rm": "i32"}
"""The int4 kernels' runtime arguments on a bf16 model (the row kernel's M besides)."""


def int4_matvec(ti: Any, *, n: int, k: int, group: int, prologue: str, swiglu: bool, residual: bool,
                setting: tuple[int, int, int, int]) -> Any:
    """kiln.kernels.triton_int4's one-row kernel compiled for this projection at `setting` (BLOCK_N,
    SPLIT, DEPTH, warps), with the constants its heuristics give it."""
    import triton

    block_n, split, depth, warps = setting
    kernel = ti._kernel()
    kernel = getattr(kernel, "fn", kernel)  # past the autotuner
    kernel = getattr(kernel, "fn", kernel)  # past the heuristics: the jitted function
    per_split = -(-(k // group) // split)
    types = INT4_TYPES
    constexprs = dict(M=1, K=k, GROUP=group, PROLOGUE=ti.PROLOGUES[prologue], SWIGLU=swiglu, HAS_BIAS=False,
                      HAS_RES=residual, PDL=True, BLOCK_N=block_n, SPLIT=split, DEPTH=depth, PER_SPLIT=per_split,
                      EVEN=n % block_n == 0 and per_split * split == k // group,
                      K_CHUNK=min(1024, triton.next_power_of_2(k)))
    aligned = ("X", "Q", "Scale", "Offset", "Y", "NormW", "Bias", "Res", "Part", "Arrived", "N", "stride_xm",
               "stride_ym", "stride_rm")
    return compile_sm90(kernel, types, constexprs, warps, aligned)


def int4_rows(tr: Any, *, n: int, k: int, group: int, prologue: str, swiglu: bool, residual: bool, rows: int,
              swap: bool, x_once: bool = False, scales_ahead: bool = False, known_only: bool = False) -> Any:
    """kiln.kernels.triton_rows' kernel compiled for this projection at `rows` rows with the setting
    its rule picks, the SWAP loop (bf16's inline PTX unpacking) or the unpacked tile's. `known_only`:
    constants the kernel does not take are left out (an older tree's kernel, before a setting)."""
    bn, split, warps, stages, bm, prefetch, _ = tr.choose_setting(rows, n, k, group, 132)
    constexprs = dict(K=k, GROUP=group, PROLOGUE=tr.PROLOGUES[prologue], SWIGLU=swiglu, HAS_BIAS=False,
                      HAS_RES=residual, PDL=True, BLOCK_M=bm, BLOCK_N=bn, SPLIT=split,
                      PER_SPLIT=-(-(k // group) // split), PREFETCH=bool(prefetch), SWAP=swap, ASM=swap,
                      X_ONCE=x_once, SCALES_AHEAD=scales_ahead)
    if known_only:
        constexprs = {name: value for name, value in constexprs.items() if name in tr._KERNEL.fn.arg_names}
    aligned = tuple(name for name in INT4_TYPES if name != "eps")
    return compile_sm90(tr._KERNEL.fn, {**INT4_TYPES, "M": "i32"}, constexprs, warps, aligned, num_stages=stages)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-3.2-3b")
    ap.add_argument("--batch", default="1,16,32")
    ap.add_argument("--slots", type=int, default=1024, help="cache capacity")
    ap.add_argument("--blocks", default="32,64", help="LOOP_BLOCK values (slots per block of a looping program)")
    ap.add_argument("--stages", default="0,3", help="LOOP_STAGES values (0: the hand-prefetched loop)")
    ap.add_argument("--warps", default=None, help="NUM_WARPS values (default: launch_settings' choice)")
    ap.add_argument("--no-rope", action="store_true", help="the attention op alone, not the fused RoPE op")
    ap.add_argument("--int4", action="store_true", help="instead: int4@triton's one-row kernel on the Llama-3.2-3B "
                    "projections (group 128) at every setting its autotuner may try")
    ap.add_argument("--int4-rows", type=int, default=None, metavar="M",
                    help="instead: int4@triton's row kernel at M rows on the same projections, SWAP and not")
    args = ap.parse_args(argv)
    if args.int4_rows is not None and not 1 <= args.int4_rows <= 64:
        ap.error(f"--int4-rows: {args.int4_rows} rows; the row kernel takes 1 to 64 (a decode step's rows)")
    try:
        from triton.backends.nvidia import compiler  # noqa: F401

        import kiln.kernels.triton_decode as td
    except ImportError as exc:
        print(f"kernel_resources: needs Triton with its NVIDIA backend ({exc})", file=sys.stderr)
        return 2
    from kiln.bench.results import write_results
    from kiln.llm.config import resolve_model
    from kiln.monitor.env import collect_env

    command = shlex.join(["python", "benchmarks/kernel_resources.py", *(argv or sys.argv[1:])])
    if args.int4_rows is not None:
        import kiln.kernels.triton_rows as tr

        rows = [{"status": "ok", "projection": name, "n": n, "k": k, "rows": args.int4_rows, "swap": swap,
                 **usage(int4_rows(tr, n=n, k=k, group=128, prologue=prologue, swiglu=swiglu, residual=residual,
                                   rows=args.int4_rows, swap=swap))}
                for name, (n, k, prologue, swiglu, residual) in INT4_3B.items() for swap in (False, True)]
        write_results(args.out, env=collect_env(), config={"kernel": "int4@triton rows", "group": 128,
                                                           "target": "sm_90 (compiled on this machine)"},
                      results=rows, columns=["projection", "n", "k", "rows", "swap", "registers", "stack_bytes",
                                             "shared_bytes"],
                      title=f"int4@triton's row kernel at {args.int4_rows} rows, Llama-3.2-3B projections, sm_90",
                      command=command)
        print(f"{len(rows)} kernels; wrote {args.out}/results.md")
        return 0
    if args.int4:
        import kiln.kernels.triton_int4 as ti

        rows = [{"status": "ok", "projection": name, "n": n, "k": k, "block_n": setting[0], "split": setting[1],
                 "depth": setting[2], "warps": setting[3],
                 **usage(int4_matvec(ti, n=n, k=k, group=128, prologue=prologue, swiglu=swiglu, residual=residual,
                                     setting=setting))}
                for name, (n, k, prologue, swiglu, residual) in INT4_3B.items() for setting in ti.SETTINGS]
        write_results(args.out, env=collect_env(), config={"kernel": "int4@triton one-row", "group": 128,
                                                           "target": "sm_90 (compiled on this machine)"},
                      results=rows, columns=["projection", "n", "k", "block_n", "split", "depth", "warps", "registers",
                                             "stack_bytes", "shared_bytes"],
                      title="int4@triton's one-row kernel per setting, Llama-3.2-3B projections, compiled for sm_90",
                      command=command)
        print(f"{len(rows)} settings; wrote {args.out}/results.md")
        return 0
    config = resolve_model(args.model).config
    ints = lambda text: [int(t) for t in text.split(",")]  # noqa: E731
    rows = []
    for batch, block, stages, warps in itertools.product(ints(args.batch), ints(args.blocks), ints(args.stages),
                                                         ints(args.warps) if args.warps else [None]):
        td.LOOP_BLOCK, td.NUM_WARPS = block, warps
        compiled, (blk, per_chunk, chunks, nwarps) = decode_attention(
            td, batch=batch, slots=args.slots, kv_heads=config.n_kv_heads, group=config.n_heads // config.n_kv_heads,
            head_dim=config.head_dim, stages=stages or None, rope=not args.no_rope)
        if per_chunk == blk and (block, stages) != (ints(args.blocks)[0], ints(args.stages)[0]):
            continue  # one block per program: LOOP_BLOCK and LOOP_STAGES do not apply, shown once
        rows.append({"status": "ok", "batch": batch, "block": blk, "chunk_slots": per_chunk, "chunks": chunks,
                     "warps": nwarps, "stages": stages if per_chunk > blk else 0, **usage(compiled)})
    config_row = {"model": args.model, "slots": args.slots, "rope": not args.no_rope,
                  "target": "sm_90 (compiled on this machine)"}
    write_results(args.out, env=collect_env(), config=config_row,
                  results=rows, columns=["batch", "block", "chunk_slots", "chunks", "warps", "stages", "registers",
                                         "stack_bytes", "shared_bytes"],
                  title=f"Decode attention per SM, {args.model} shape, {args.slots} slots, compiled for sm_90",
                  command=command)
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
