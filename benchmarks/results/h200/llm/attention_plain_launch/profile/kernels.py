"""The batch-16 decode steps' kernels from call 1's two `--profile-decode` traces, through kiln's own
trace tables (kiln.profile.trace.kernel_table): per kernel, calls and exclusive time per step and
per call, and the median time a call started before the kernels before it had ended. Run from the
repo root over the traces the call wrote (not kept: `--profile-decode 16` writes them again):

    python benchmarks/results/h200/llm/attention_plain_launch/profile/kernels.py DIR/kiln-compiled_b16 \\
        DIR/kiln-compiled_int4_triton_b16 --out benchmarks/results/h200/llm/attention_plain_launch/profile/kernels
"""

import argparse
import shlex
import sys
from pathlib import Path

from kiln.bench.results import write_results
from kiln.monitor.env import collect_env
from kiln.profile.trace import device_events, kernel_table, load_trace

STEPS = 16


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="+", type=Path, help="decode_profile/<row> folders")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    results = []
    for row in args.rows:
        trace = load_trace(row / "trace.pt.trace.json.gz")
        kernels, _ = kernel_table(device_events(trace["traceEvents"] if isinstance(trace, dict) else trace), STEPS)
        results += [{"status": "ok", "row": row.name, "kernel": k["name"][:40], "calls_per_step": k["calls_per_step"],
                     "excl_us_per_step": k["excl_us_per_step"],
                     "excl_us_per_call": k["excl_us_per_step"] / k["calls_per_step"],
                     "early_us_median": k["early_us_median"]} for k in kernels]
    write_results(args.out, env=collect_env(), config={"steps": STEPS}, results=results,
                  columns=["row", "kernel", "calls_per_step", "excl_us_per_call", "early_us_median"],
                  title="batch-16 decode kernels (call 1's traces)",
                  command=shlex.join(["python", sys.argv[0], *sys.argv[1:]]))


if __name__ == "__main__":
    main()
