"""Fault injection for testing recovery (CI's exactness test, or a user's own drill).

`KILN_FAULT=kill@K` makes the rank(s) named by `KILN_FAULT_RANK` (default: all) SIGKILL
themselves right after optimizer step K; `hang@K` makes them stop participating (sleep) so the
others' next collective times out. Only on the first attempt of a torchrun job
(TORCHELASTIC_RESTART_COUNT 0), so an elastic restart runs clean. Unset: no effect, no cost
beyond one comparison per step.
"""

from __future__ import annotations

import os
import signal
import time


def planned_fault(rank: int) -> tuple[str, int] | None:
    spec = os.environ.get("KILN_FAULT", "")
    if not spec or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return None
    who = os.environ.get("KILN_FAULT_RANK")
    if who is not None and int(who) != rank:
        return None
    kind, _, step = spec.partition("@")
    if kind not in ("kill", "hang") or not step.isdigit():
        raise ValueError(f"KILN_FAULT must be kill@STEP or hang@STEP, got {spec!r}")
    return kind, int(step)


def inject(fault: tuple[str, int] | None, step: int) -> None:
    if fault is None or step != fault[1]:
        return
    if fault[0] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # hang: the peers' collective must time out (distributed.timeout_s)
        time.sleep(3600)
