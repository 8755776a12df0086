"""Memory in a profiled window: peak by category and a CUDA allocator snapshot.

- Peak by category comes from torch.profiler's memory timeline (profile_memory + record_shapes +
  with_stack), which tags each tensor as parameter, gradient, optimizer state, activation, input,
  temporary or autograd detail. Works for CUDA and CPU.
- The CUDA snapshot comes from `torch.cuda.memory._record_memory_history` / `_snapshot`: the
  pickle opens at https://pytorch.org/memory_viz (every allocation with its stack); from it kiln
  reports reserved and allocated bytes and the allocated peak inside the window.
Both APIs are private or deprecated in places; each step degrades to `n/a` with the reason.
"""

from __future__ import annotations

import json
import pickle
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from kiln.safe_io import write_atomic


def na(reason: str) -> dict[str, Any]:
    return {"status": "n/a", "reason": reason}


def memory_by_category(prof: Any, device: torch.device) -> dict[str, Any]:
    try:
        from torch.profiler import _memory_profiler

        order = sorted(_memory_profiler._CATEGORY_TO_INDEX.items(), key=lambda kv: kv[1])
        names = ["unknown" if category is None else category.name.lower() for category, _ in order]
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated in favour of the snapshot, still exact
            path = Path(tmp) / "timeline.json"
            dev = f"cuda:{device.index or 0}" if device.type == "cuda" else "cpu"
            prof.export_memory_timeline(str(path), device=dev)
            _, sizes = json.loads(path.read_text())
    except Exception as exc:
        return na(f"torch.profiler memory timeline unavailable ({type(exc).__name__}: {exc})")
    if not sizes:
        return na("the memory timeline recorded no allocations on this device")
    rows = [row[1:] for row in sizes]  # column 0 is padding in torch's layout
    totals = [sum(r) for r in rows]
    peak_at = max(range(len(totals)), key=totals.__getitem__)
    return {
        "status": "ok",
        "peak_bytes": totals[peak_at],
        "at_peak": {name: rows[peak_at][i] for i, name in enumerate(names)},
        "max_by_category": {name: max(r[i] for r in rows) for i, name in enumerate(names)},
    }


class CudaMemoryHistory:
    """Records allocator history for a window; `stop` dumps the pickle and summarises it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reason = ""
        record = getattr(torch.cuda.memory, "_record_memory_history", None)
        if device.type != "cuda":
            self.reason = "no CUDA device (CPU run): the allocator snapshot is CUDA's"
        elif record is None or not hasattr(torch.cuda.memory, "_snapshot"):
            self.reason = f"torch {torch.__version__} has no torch.cuda.memory._record_memory_history"
        self.active = False

    def start(self) -> None:
        if self.reason:
            return
        try:
            torch.cuda.memory._record_memory_history(max_entries=200_000)
            self.active = True
        except Exception as exc:
            self.reason = f"_record_memory_history failed ({type(exc).__name__}: {exc})"

    def stop(self, path: Path) -> dict[str, Any]:
        if not self.active:
            return na(self.reason)
        try:
            snapshot = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
            self.active = False
        write_atomic(path, pickle.dumps(snapshot))
        return {"status": "ok", "file": path.name, **summarise_snapshot(snapshot, self.device.index or 0)}


def summarise_snapshot(snapshot: dict[str, Any], device_index: int) -> dict[str, Any]:
    segments = [s for s in snapshot.get("segments", []) if s.get("device", device_index) == device_index]
    reserved = sum(int(s.get("total_size", 0)) for s in segments)
    allocated = sum(int(b.get("size", 0)) for s in segments for b in s.get("blocks", [])
                    if b.get("state") == "active_allocated")
    traces = snapshot.get("device_traces") or []
    trace = traces[device_index] if device_index < len(traces) else []
    # Replay the window's allocations backwards from the allocated total at its end.
    net = running = highest = 0
    for entry in trace:
        delta = {"alloc": 1, "free_completed": -1}.get(entry.get("action"), 0) * int(entry.get("size", 0))
        running += delta
        highest = max(highest, running)
        net += delta
    start = allocated - net
    return {
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "window_peak_allocated_bytes": start + highest,
        "allocations_in_window": sum(e.get("action") == "alloc" for e in trace),
    }
