"""Fault injection for testing recovery and monitoring (CI's tests, or a user's own drill).

`KILN_FAULT=kill@K` makes the rank(s) named by `KILN_FAULT_RANK` (default: all) SIGKILL
themselves right after optimizer step K; `hang@K` makes them stop participating (sleep) so the
others' next collective times out; `slow@K:MS` makes them sleep MS milliseconds after every
step from K on (a straggler: a slow host, a throttled GPU, a noisy neighbour). Only on the first
attempt of a torchrun job (TORCHELASTIC_RESTART_COUNT 0), so an elastic restart runs clean.
Unset: no effect, no cost beyond one comparison per step.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

_FORMS = "kill@STEP, hang@STEP or slow@STEP:MS"


@dataclass(frozen=True)
class Fault:
    kind: str  # kill | hang | slow
    step: int
    ms: float = 0.0  # slow: milliseconds added after each step from `step` on


def planned_fault(rank: int) -> Fault | None:
    spec = os.environ.get("KILN_FAULT", "")
    if not spec or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return None
    who = os.environ.get("KILN_FAULT_RANK")
    if who is not None and int(who) != rank:
        return None
    kind, _, rest = spec.partition("@")
    step, _, ms = rest.partition(":")
    valid = step.isdigit() and (
        (kind in ("kill", "hang") and not ms) or (kind == "slow" and ms.replace(".", "", 1).isdigit())
    )
    if not valid:
        raise ValueError(f"KILN_FAULT must be {_FORMS}, got {spec!r}")
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
    while True:  # hang: the peers' collective must time out (distributed.timeout_s)
        time.sleep(3600)
