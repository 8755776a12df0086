"""Gloo ranks for a test (two unless told): `run_ranks` launches a worker script through torchrun and returns
the JSON report rank 0 wrote; a worker ends with `finish(report, out)`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch.distributed as dist

HERE = Path(__file__).parent


def run_ranks(worker: str, out: Path, nproc: int = 2) -> dict:
    """Run `tests/distributed/<worker> OUT` on `nproc` gloo ranks (torchrun --standalone); its report."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(HERE / worker), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def finish(report: dict, out: str) -> None:
    """Rank 0 writes `report`; every rank leaves the group and the process (never returns)."""
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(report, f)
    # DTensor's collectives are asynchronous until used: let every rank finish before tearing down
    # the group (an unfinished gloo work at destruction aborts the process).
    dist.barrier()
    dist.destroy_process_group()
    # Leave without interpreter finalization, as kiln's own ranks do (kiln/__main__.py): gloo with
    # DTensor occasionally aborted in C++ static destructors at exit after the report was written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
