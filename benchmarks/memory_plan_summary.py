"""Summary of benchmarks/memory_plan_8b.sh: per run, its exit code and seconds, tokens/s (total and per GPU),
MFU, kiln's GPU memory plan (parts, allocated peak, reserved figure) beside the measured peaks over the ranks
(allocated against the plan's allocated peak, reserved against its reserved figure), and for a refused run
its one-line message, through kiln.bench.results.write_results into OUT_DIR/memory_plan_8b/results.{json,md}.
A run named `refused` is expected to exit 2 (status ok when it did); the others to exit 0.

    python3 benchmarks/memory_plan_summary.py RUNS_DIR OUT_DIR NAME...
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from kiln.bench.results import write_results
from kiln.monitor.env import collect_env

GIB = 2**30


def one(runs: Path, out: Path, name: str) -> dict | None:
    exit_file = runs / f"{name}.exit"
    if not exit_file.is_file():
        return None
    code, seconds = exit_file.read_text().split()
    expected = 2 if name == "refused" else 0
    row: dict = {"run": name, "status": "ok" if int(code) == expected else "error", "exit": int(code),
                 "expected_exit": expected, "seconds": float(seconds)}
    summary_file = runs / name / "summary.json"
    if summary_file.is_file():
        s = json.loads(summary_file.read_text())
        plan = s.get("memory_plan") or {}
        measured = plan.get("measured") or {}
        world = s.get("world_size") or 1
        row.update(run_status=s.get("status"), steps=s.get("steps"), tokens_per_s=s.get("tokens_per_s"),
                   tokens_per_s_per_gpu=(s.get("tokens_per_s") or 0) / world, mfu=s.get("mfu"),
                   step_ms_median=s.get("step_ms_median"), final_loss=s.get("final_loss"),
                   plan_parts=plan.get("parts"), plan_phases=plan.get("phases"), plan_bytes=plan.get("total_bytes"),
                   plan_reserved_bytes=plan.get("reserved_bytes"),
                   max_allocated_bytes=measured.get("max_allocated_bytes"),
                   max_reserved_bytes=measured.get("max_reserved_bytes"),
                   allocated_over_plan=plan.get("allocated_over_plan"),
                   reserved_over_plan=plan.get("reserved_over_plan"))
        row["plan_check"] = _check(row)
    log = out / f"{name}.log"
    if log.is_file():
        errors = [line for line in log.read_text(errors="replace").splitlines() if "error:" in line]
        if errors:
            row["message"] = errors[-1][:2000]
    return row


def _check(row: dict) -> str | None:
    """`ok` when the allocated peak is within 10 % of the plan's and the reserved peak at most the plan's
    reserved figure (what the refusal relies on), else what missed; None without a measured peak."""
    allocated, reserved = row.get("allocated_over_plan"), row.get("reserved_over_plan")
    if allocated is None:
        return None
    missed = ([f"allocated/plan {allocated}"] if not 0.9 <= allocated <= 1.1 else []) + \
        ([f"reserved/plan {reserved}"] if reserved is not None and reserved > 1 else [])
    return "ok" if not missed else "missed: " + ", ".join(missed)


COLUMNS = ["run", "status", "exit", "seconds", "tokens_per_s_per_gpu", "mfu", "plan_gib", "peak_allocated_gib",
           "allocated_over_plan", "plan_reserved_gib", "peak_reserved_gib", "reserved_over_plan", "plan_check"]


def main(argv: list[str]) -> int:
    runs, out, names = Path(argv[0]), Path(argv[1]), argv[2:]
    rows = [r for r in (one(runs, out, n) for n in names) if r is not None]
    for r in rows:
        for key, field in (("plan_gib", "plan_bytes"), ("peak_allocated_gib", "max_allocated_bytes"),
                           ("plan_reserved_gib", "plan_reserved_bytes"), ("peak_reserved_gib", "max_reserved_bytes")):
            if isinstance(r.get(field), int):
                r[key] = round(r[field] / GIB, 2)
    notes = [f"- {r['run']} plan: " + ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in r["plan_parts"].items())
             + "; at " + ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in (r.get("plan_phases") or {}).items())
             for r in rows if r.get("plan_parts")]
    notes += [f"- {r['run']}: `{r['message']}`" for r in rows if r.get("message")]
    path = write_results(out / "memory_plan_8b", env=collect_env(), config={"runs": names}, results=rows,
                         columns=COLUMNS, title="Llama-3.1-8B at seq 8192 under FSDP2: GPU memory plan vs measured peak",
                         command="bash benchmarks/memory_plan_8b.sh  # " + shlex.join(sys.argv),
                         notes="\n".join(notes))
    print(path.with_name("results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
