"""Fault injection for testing recovery and failure reports (CI's tests, or a user's own drill).

`KILN_FAULT=KIND@K` acts on the rank(s) named by `KILN_FAULT_RANK` (default: all) right after
optimizer step K, before the step counts as done:

- `kill`: SIGKILL this process (a crashed or OOM-killed rank);
- `hang`: stop participating (sleep), so the others' next collective times out;
- `cuda-oom`: raise torch.cuda.OutOfMemoryError, as a too-large batch would inside the step;
- `host-oom`: raise MemoryError (host memory exhausted in Python);
- `kill-worker`: SIGKILL one of this rank's DataLoader worker processes (needs file or user data
  with data.num_workers > 0); the loader notices at its next batch.

Only on the first attempt of a torchrun job (TORCHELASTIC_RESTART_COUNT 0), so an elastic restart
runs clean. Unset: no effect, no cost beyond one comparison per step.
"""

from __future__ import annotations

import os
import signal
import time

KINDS = ("kill", "hang", "cuda-oom", "host-oom", "kill-worker")


def planned_fault(rank: int) -> tuple[str, int] | None:
    spec = os.environ.get("KILN_FAULT", "")
    if not spec or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return None
    who = os.environ.get("KILN_FAULT_RANK")
    if who is not None and int(who) != rank:
        return None
    kind, _, step = spec.partition("@")
    if kind not in KINDS or not step.isdigit():
        raise ValueError(f"KILN_FAULT must be KIND@STEP with KIND one of {', '.join(KINDS)}, got {spec!r}")
    return kind, int(step)


def inject(fault: tuple[str, int] | None, step: int) -> None:
    if fault is None or step != fault[1]:
        return
    kind = fault[0]
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "cuda-oom":
        import torch

        raise torch.cuda.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate 2.00 GiB (injected by KILN_FAULT=cuda-oom@{step})")
    elif kind == "host-oom":
        raise MemoryError(f"injected by KILN_FAULT=host-oom@{step}")
    elif kind == "kill-worker":
        _kill_a_loader_worker()
    else:
        while True:  # hang: the peers' collective must time out (distributed.timeout_s)
            time.sleep(3600)


def _kill_a_loader_worker() -> None:
    import multiprocessing

    # DataLoader workers are multiprocessing children of this process (torch.utils.data.dataloader).
    workers = [p for p in multiprocessing.active_children() if p.pid is not None]
    if not workers:
        raise RuntimeError("KILN_FAULT=kill-worker: this process has no DataLoader worker to kill "
                           "(synthetic data, or data.num_workers=0)")
    os.kill(workers[0].pid, signal.SIGKILL)
