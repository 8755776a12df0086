"""Synthetic GPU timelines for the profile tests."""

from __future__ import annotations


def serial_timeline(windows: int, kernels: list[tuple[str, float]], gap_us: float) -> list[dict]:
    """`windows` steps (or prefills) on one stream: each one's kernels (name, us) back to back with
    `gap_us` of idle before every kernel but the first of the whole trace."""
    events, t = [], 1000.0
    for _ in range(windows):
        for name, dur in kernels:
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": t, "dur": dur})
            t += dur + gap_us
    return events
