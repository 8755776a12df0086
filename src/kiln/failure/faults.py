"""Fault injection for testing recovery, monitoring and failure reports (CI's tests, or a user's
own drill).

`KILN_FAULT=KIND@K` acts on the rank(s) named by `KILN_FAULT_RANK` (default: all) right after
optimizer step K, before the step counts as done:

- `kill`: SIGKILL this process (a crashed or OOM-killed rank);
- `hang`: stop participating (sleep), so the others' next collective times out; the hung rank
  takes SIGTERM's default action again, so the stop torchrun sends the group before a restart
  ends it at once instead of after torchrun's shutdown grace (a test's wait, not the recovery);
- `slow@K:MS`: sleep MS milliseconds after every step from K on (a straggler: a slow host, a
  throttled GPU, a noisy neighbour);
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
from dataclasses import dataclass

from kiln.errors import ConfigError

ONCE = ("kill", "hang", "cuda-oom", "host-oom", "kill-worker")


@dataclass(frozen=True)
class Fault:
    kind: str  # one of ONCE, or slow
    step: int
    ms: float = 0.0  # slow: milliseconds added after each step from `step` on


def planned_fault(rank: int) -> Fault | None:
    spec = os.environ.get("KILN_FAULT", "")
    if not spec or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return None
    who = os.environ.get("KILN_FAULT_RANK")
    if who is not None and not who.isdigit():
        raise ConfigError("KILN_FAULT_RANK", f"{who!r} is not a rank number")
    if who is not None and int(who) != rank:
        return None
    kind, _, rest = spec.partition("@")
    step, _, ms = rest.partition(":")
    valid = step.isdigit() and (
        (kind in ONCE and not ms) or (kind == "slow" and ms.replace(".", "", 1).isdigit())
    )
    if not valid:
        raise ConfigError("KILN_FAULT", f"{spec!r} is not a fault", [f"{kind}@STEP" for kind in ONCE] + ["slow@STEP:MS"])
    return Fault(kind, int(step), float(ms) if ms else 0.0)


def inject(fault: Fault | None, step: int) -> None:
    if fault is None or step < fault.step:
        return
    if fault.kind == "slow":
        time.sleep(fault.ms / 1e3)  # the injected slowness itself, not a synchronisation
        return
    if step != fault.step:
        return
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "cuda-oom":
        import torch

        raise torch.cuda.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate 2.00 GiB (injected by KILN_FAULT=cuda-oom@{step})")
    elif fault.kind == "host-oom":
        raise MemoryError(f"injected by KILN_FAULT=host-oom@{step}")
    elif fault.kind == "kill-worker":
        _kill_a_loader_worker()
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # kiln's stop-at-the-next-step handler would keep it
        while True:  # hang: the peers' collective must time out (distributed.timeout_s)
            time.sleep(3600)


def _kill_a_loader_worker() -> None:
    import multiprocessing

    # DataLoader workers are multiprocessing children of this process (torch.utils.data.dataloader).
    workers = [p for p in multiprocessing.active_children() if p.pid is not None]
    if not workers:
        raise RuntimeError("KILN_FAULT=kill-worker: this process has no DataLoader worker to kill "
                           "(synthetic data, or data.num_workers=0)")
    pid = workers[0].pid
    os.kill(pid, signal.SIGKILL)
    # Wait until it is dead without reaping it (WNOWAIT): torch's SIGCHLD handler then finds it
    # and raises here, in the step that injected the fault, not whenever the signal is handled.
    if hasattr(os, "waitid"):
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
