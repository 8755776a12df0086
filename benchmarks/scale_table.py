"""Collect `kiln train` run dirs of one model at several world sizes into a scaling table.

    python benchmarks/scale_table.py --out DIR RUN_DIR [RUN_DIR ...]

Efficiency = per-device throughput at N ranks / per-device throughput of the 1-rank run (weak
scaling: the per-device batch stays fixed). Writes DIR/results.json and results.md with the
row keys of `kiln bench scale` (strategy, world, throughput, throughput_per_device, efficiency).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from kiln.bench.results import write_results
from kiln.monitor.env import collect_env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="Scaling")
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args(argv)
    rows = []
    for run in args.runs:
        path = Path(run) / "summary.json"
        if not path.exists():
            rows.append({"status": "error", "run": Path(run).name, "reason": "no summary.json (run failed)"})
            continue
        s = json.loads(path.read_text())
        rows.append({
            "status": "ok" if s["status"] == "completed" else "error",
            "run": Path(run).name, "strategy": s.get("strategy"), "world": s["world_size"],
            "global_batch": s.get("global_batch"), "step_ms": s["step_ms_median"],
            "throughput": s["samples_per_s"], "throughput_per_device": s["samples_per_s_per_device"],
            "mfu": s.get("mfu"), "first_step_s": s.get("first_step_s"),
            "peak_mem_bytes": s.get("peak_mem_bytes"), "final_loss": s.get("final_loss"),
            "graphs": s.get("compile", {}).get("graphs"),
        })
    base = next((r for r in rows if r.get("world") == 1 and r["status"] == "ok"), None)
    for r in rows:
        if base and r["status"] == "ok":
            r["efficiency"] = r["throughput_per_device"] / base["throughput_per_device"]
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    write_results(args.out, env=collect_env(), config={"runs": args.runs}, results=rows, command=command,
                  title=args.title,
                  columns=["run", "strategy", "world", "global_batch", "step_ms", "throughput",
                           "throughput_per_device", "efficiency", "mfu", "first_step_s", "peak_mem_bytes", "status"])
    for r in rows:
        print({k: r.get(k) for k in ("run", "strategy", "world", "throughput_per_device", "efficiency", "status")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
