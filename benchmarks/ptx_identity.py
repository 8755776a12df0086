"""Whether two source trees give kiln's Triton decode kernels the same machine code, without a GPU:
each kernel is compiled for sm_90 on this machine (kernel_resources.py's compile: Triton's frontend,
its NVIDIA passes and ptxas run on a CPU) from tree A and from tree B, each tree in a process of its
own (PYTHONPATH=TREE/src), and its PTX instruction stream is hashed with the debug sections, line
information and comments removed. A change that moves kernel code between modules, or adds a
setting whose default path is unchanged, shows every kernel `same`: its default launches cannot
have changed speed. A kernel argument one tree lacks is left out of its compile; the row kernel's
module settings and the attention's PDL constant (`early_launch`, where a tree has it) are read
from each tree. What is compared is the kernels' code: the other choices made at launch (grids,
launch attributes, which kernel a shape takes) are not.

The kernels: int4@triton's row kernel at 16 rows (both loops) and kiln's bf16 row kernel at 16 rows
on the Llama-3.2-3B projections, int4's one-row kernel on the same projections at its first
setting, and the fused RoPE decode attention at batch 1 and 16.

    python benchmarks/ptx_identity.py --base DIR --out OUT [--head DIR] [--only wo]

DIR holds a `src/` (e.g. `git archive REV src | tar -x -C DIR`); --head defaults to this checkout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SKINNY_SETTING = {"BLOCK_N": 64, "BLOCK_K": 256, "SPLIT": 2, "warps": 4, "stages": 4}
"""The bf16 row kernel's launch setting compiled here (one setting: the code around it is what is compared)."""


def instructions(ptx: str) -> str:
    """The PTX's instruction stream: no debug sections, line information, comments or labels' names."""
    text = ptx.split(".section\t.debug")[0]
    kept = [re.sub(r"//.*", "", line).rstrip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith((".loc", ".file", "//"))]
    return "\n".join(kept)


def _compile(kr: Any, fn: Any, types: dict[str, str], constexprs: dict[str, Any], warps: int, aligned: tuple[str, ...],
             stages: int = 2) -> str:
    names = set(fn.arg_names)
    kept = {k: v for k, v in constexprs.items() if k in names}
    return kr.compile_sm90(fn, {k: v for k, v in types.items() if k in names}, kept, warps,
                           tuple(a for a in aligned if a in names), num_stages=stages).asm["ptx"]


def dump(only: str | None) -> dict[str, str]:
    """{kernel: hash of its instruction stream} for the kiln on sys.path (run inside a tree's process)."""
    sys.path.insert(0, str(HERE))
    import kernel_resources as kr

    import kiln.kernels.triton_decode as td
    import kiln.kernels.triton_int4 as ti
    import kiln.kernels.triton_rows as tr
    import kiln.kernels.triton_skinny as ts

    def digest(ptx: str) -> str:
        return hashlib.sha256(instructions(ptx).encode()).hexdigest()[:16]

    out = {}
    for name, (n, k, prologue, swiglu, residual) in kr.INT4_3B.items():
        if only and name != only:
            continue
        for swap in (False, True):
            out[f"int4 rows {name} swap={int(swap)}"] = digest(kr.int4_rows(
                tr, n=n, k=k, group=128, prologue=prologue, swiglu=swiglu, residual=residual, rows=16, swap=swap,
                x_once=getattr(tr, "SWAP_X_ONCE", False), scales_ahead=getattr(tr, "SWAP_SCALES_AHEAD", False),
                known_only=True).asm["ptx"])
        out[f"int4 one-row {name}"] = digest(kr.int4_matvec(ti, n=n, k=k, group=128, prologue=prologue, swiglu=swiglu,
                                                             residual=residual, setting=ti.SETTINGS[0]).asm["ptx"])
        types = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "NormW": "*bf16", "Bias": "*bf16", "Res": "*bf16",
                 "Part": "*fp32", "Arrived": "*i32", "M": "i32", "N": "i32", "eps": "fp32", "stride_xm": "i32",
                 "stride_wn": "i32", "stride_ym": "i32", "stride_rm": "i32"}
        s = SKINNY_SETTING
        constexprs = dict(K=k, PROLOGUE=1 if prologue != "none" else 0, HAS_BIAS=False, HAS_RES=residual, PDL=True,
                          BLOCK_M=16, BLOCK_N=s["BLOCK_N"], BLOCK_K=s["BLOCK_K"], SPLIT=s["SPLIT"],
                          PER_SPLIT=k // s["SPLIT"], EVEN=n % s["BLOCK_N"] == 0)
        out[f"bf16 rows {name}"] = digest(_compile(kr, ts._KERNEL.fn, types, constexprs, s["warps"],
                                                   ("X", "W", "Y", "Part"), s["stages"]))
    if not only:
        for batch in (1, 16):
            chunks = td.launch_settings(batch, 8, 640)[2]
            early = getattr(td, "early_launch", None)  # the tree's rule for the PDL constant, where it has one
            compiled, _ = kr.decode_attention(td, batch=batch, slots=640, kv_heads=8, group=3, head_dim=128,
                                              stages=td.LOOP_STAGES, rope=True,
                                              pdl=early(True, chunks) if early is not None else True)
            out[f"decode attention batch {batch}"] = digest(compiled.asm["ptx"])
    return out


def tree_hashes(tree: Path, only: str | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--dump"] + (["--only", only] if only else [])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"ptx_identity: compiling {tree}'s kernels failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, help="a tree with src/ (the tree before)")
    ap.add_argument("--head", type=Path, default=HERE.parent, help="a tree with src/ (default: this checkout)")
    ap.add_argument("--out", help="results directory")
    ap.add_argument("--only", choices=sorted(["wqkv", "wo", "w_gate_up", "w_down", "lm_head"]),
                    help="one projection only (no decode attention)")
    ap.add_argument("--dump", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.dump:
        print(json.dumps(dump(args.only)))
        return 0
    if args.base is None or args.out is None:
        ap.error("--base and --out are required")
    for flag, tree in (("--base", args.base), ("--head", args.head)):
        if not (tree / "src" / "kiln").is_dir():
            ap.error(f"{flag}: {tree} has no src/kiln (make one with: git archive REV src | tar -x -C {tree})")
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError as exc:
        print(f"ptx_identity: needs Triton with its NVIDIA backend ({exc})", file=sys.stderr)
        return 2
    from kiln.bench.results import write_results
    from kiln.monitor.env import collect_env

    base, head = tree_hashes(args.base, args.only), tree_hashes(args.head, args.only)
    rows = [{"status": "ok", "kernel": name, "base": base.get(name, "-"), "head": head.get(name, "-"),
             "same": base.get(name) == head.get(name)} for name in sorted(set(base) | set(head))]
    command = shlex.join(["python", "benchmarks/ptx_identity.py", *(argv if argv is not None else sys.argv[1:])])
    write_results(args.out, env=collect_env(), config={"base": str(args.base), "head": str(args.head),
                                                       "target": "sm_90 (compiled on this machine)"},
                  results=rows, columns=["kernel", "same", "base", "head"],
                  title="kiln's Triton decode kernels: PTX instruction streams of two trees", command=command)
    differ = [r["kernel"] for r in rows if not r["same"]]
    print(f"{len(rows) - len(differ)} of {len(rows)} kernels the same" + (f"; differ: {', '.join(differ)}" if differ
                                                                          else "") + f"; wrote {args.out}/results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
