"""How kiln train fails on GPUs: a real CUDA OOM in the step, and NCCL jobs whose rank dies, raises
or hangs. CPU tests cover gloo; NCCL fails differently (the watchdog aborts survivors with
SIGABRT, a rank blocked in a CUDA sync ignores SIGTERM until the agent's SIGKILL) and only a GPU
shows it. Each case runs `kiln train` as a user would and checks the message the console ends
with: the rank that failed first named, what was kept, exit 1, summary.json, error.log, no .tmp.

    python benchmarks/failure_gpu.py --out DIR            # 2+ GPUs: all cases (~4-5 min); 1 GPU: the OOM case
    python benchmarks/failure_gpu.py --out DIR --device cpu   # dry run: gloo ranks, OOM injected

Writes DIR/failure_gpu/results.json, results.md and one stderr log per case.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from kiln.bench.results import write_results
from kiln.monitor.env import collect_env

TINY = ["model.kwargs.hidden_size=256", "model.kwargs.num_layers=4", "data.batch_size=64", "training.steps=40",
        "training.log_interval=2", "checkpoint.interval=4", "metrics.console=false", "metrics.tensorboard=false"]
COLUMNS = ["case", "status", "exit_code", "named", "kept_step", "summary", "error_log", "tmp_left", "console_lines",
           "wall_s", "first_line", "problems"]


def _cases(device: str, gpus: int) -> list[dict]:
    dev = [f"training.device={device}"] if device == "cpu" else []
    oom = {"name": "cuda_oom_in_step", "ranks": 1, "fault": None, "expect_rank": None, "expect": "CUDA out of memory",
           # batch 2^20 through 24 blocks of width 1024: tens of GB of activations, OOM in step 1
           "args": [*dev, "data.batch_size=1048576", "data.synthetic_samples=1048576", "metrics.mfu=false",
                    "training.steps=3", "metrics.console=false", "metrics.tensorboard=false"], "kept": None}
    if device == "cpu":  # no real CUDA OOM on a CPU: inject one
        oom.update(fault="cuda-oom@6", args=[*dev, *TINY], kept=4, expect="CUDA out of memory")
    multi = [
        {"name": "rank_killed", "ranks": 2, "fault": "kill@6", "expect_rank": 1, "expect": "killed by SIGKILL",
         "args": [*dev, *TINY, "distributed.strategy=ddp"], "kept": 4},
        {"name": "rank_cuda_oom", "ranks": 2, "fault": "cuda-oom@6", "expect_rank": 1, "expect": "CUDA out of memory",
         "args": [*dev, *TINY, "distributed.strategy=ddp"], "kept": 4},
        {"name": "rank_hangs", "ranks": 2, "fault": "hang@6", "expect_rank": None, "expect": "",
         "args": [*dev, *TINY, "distributed.strategy=ddp", "distributed.timeout_s=15"], "kept": 4},
    ]
    return [oom, *(multi if gpus >= 2 or device == "cpu" else [])]


def _run_case(case: dict, out: Path, limit_s: float) -> dict:
    run_dir = out / "runs" / case["name"]
    cmd = [sys.executable, "-m", "kiln", "train", "--run-dir", str(run_dir)]
    if case["ranks"] > 1:
        cmd[4:4] = ["--nproc-per-node", str(case["ranks"])]
    cmd += case["args"]
    # NCCL's watchdog waits up to 60 s for flight-recorder dumps before it aborts a timed-out rank.
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "10000"}
    if case["fault"]:
        env["KILN_FAULT"] = case["fault"]
        if case["ranks"] > 1:
            env["KILN_FAULT_RANK"] = "1"
    started = time.perf_counter()
    # A session of its own, so a case that overruns takes its agent and ranks down with it.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=limit_s)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        code = None
    wall = time.perf_counter() - started
    (out / f"{case['name']}.stderr.log").write_text(f"$ {shlex.join(cmd)}\n{err}")
    lines = err.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("kiln: failed")), None)
    message = lines[start:] if start is not None else []
    text = "\n".join(message)
    summary = _read_json(run_dir / "summary.json")
    kept = next((int(line.split("checkpoint step ")[1].split()[0]) for line in message
                 if "checkpoint step " in line and " is intact" in line), None)
    problems = []
    if code != 1:
        problems.append(f"exit code {code}")
    if not message:
        problems.append("no failure message")
    if case["expect"] and case["expect"] not in text:
        problems.append(f"message lacks {case['expect']!r}")
    named = None
    if case["expect_rank"] is not None:
        named = f"on rank {case['expect_rank']}" in (message[0] if message else "")
        if not named:
            problems.append(f"rank {case['expect_rank']} not named first")
    if case["kept"] is not None and kept != case["kept"]:
        problems.append(f"kept {kept}, expected checkpoint step {case['kept']}")
    if "Traceback" in err:
        problems.append("a Python traceback reached the console")
    if (summary or {}).get("status") != "failed":
        problems.append(f"summary.json status {(summary or {}).get('status')}")
    tmp_left = sorted(p.name for p in (run_dir / "checkpoints").glob("*.tmp")) if (run_dir / "checkpoints").is_dir() else []
    if tmp_left:
        problems.append(f"left {tmp_left}")
    return {"case": case["name"], "status": "error" if problems else "ok", "exit_code": code, "named": named,
            "kept_step": kept, "summary": (summary or {}).get("status"), "error_log": (run_dir / "error.log").is_file(),
            "tmp_left": len(tmp_left), "console_lines": len(lines), "wall_s": round(wall, 1),
            "first_line": message[0] if message else (lines[-1] if lines else ""), "message": message,
            "problems": "; ".join(problems), "summary_error": (summary or {}).get("error"),
            "failed_rank": (summary or {}).get("failed_rank")}


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--budget-s", type=float, default=420, help="stop starting cases after this many seconds")
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    import torch

    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    if args.device == "cuda" and gpus == 0:
        print("no CUDA device: use --device cpu for a dry run", file=sys.stderr)
        return 2
    out = Path(args.out) / "failure_gpu"
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in _cases(args.device, gpus):
        left = deadline - time.monotonic()
        if left < 60:
            rows.append({"case": case["name"], "status": "skipped", "problems": f"time budget ({args.budget_s:.0f} s) spent",
                         "first_line": "", "console_lines": 0, "wall_s": 0.0, "exit_code": None})
            continue
        row = _run_case(case, out, limit_s=min(left, 180))
        rows.append(row)
        print(f"{row['case']}: {row['status']} in {row['wall_s']} s  {row['problems']}", flush=True)
    command = shlex.join(["python", "benchmarks/failure_gpu.py", *(argv if argv is not None else sys.argv[1:])])
    write_results(out, env=collect_env(), config={"device": args.device, "gpus": gpus}, results=rows,
                  columns=COLUMNS, title="kiln train failures on GPU (messages, kept checkpoint, cleanup)",
                  command=command)
    print(f"\n{'case':<18} {'status':<7} {'exit':<5} {'lines':<6} {'wall s':<7} first line")
    for r in rows:
        print(f"{r['case']:<18} {r['status']:<7} {r['exit_code']!s:<5} {r['console_lines']:<6} {r['wall_s']:<7} "
              f"{r['first_line'][:110]}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
