"""`kiln bench llm --profile-decode N`: after the timed rounds, a profiled window of decode steps
per kiln row (kiln.profile.decode), in its own folder, with its figures on the row."""

from __future__ import annotations

import re
from pathlib import Path

from kiln.bench.row_failure import failure
from kiln.llm.weights import decode_weight_bytes


def profile_rows(bench, ready: list) -> None:
    """After timing: a profiled decode window per kiln row, in its own folder under profile_dir."""
    for r in ready:
        if not (r.ok and r.engine_name.startswith("kiln")):
            continue
        folder = Path(bench.opts.profile_dir) / re.sub(r"[^A-Za-z0-9_.-]+", "_", r.name).strip("_")
        weights = r.row.get("weight_bytes") or decode_weight_bytes(bench.variants[r.quant].model)
        step_bytes = weights + bench.window_kv_bytes(r.row.batch, bench.opts.profile_decode)
        title = f"Decode profile: {r.name}, {bench.opts.model} ({bench.opts.dtype}, batch {r.row.batch})"
        try:
            s = r.engine.profile_decode(bench.opts.profile_decode, folder, step_bytes=step_bytes, title=title,
                                        copy_bytes_per_s=bench.ceilings.copy_bytes_per_s if bench.ceilings else None)
        except Exception as exc:
            r.row.profile_error = failure(exc)[1]
            bench.log(f"{r.name}: decode profile failed ({r.row.profile_error})")
            continue
        gpu = s["gpu"]
        r.row.update(profile=str(folder / "summary.md"), profile_verdict=s["verdict"],
                     profile_ms_per_step=s["wall_ms_per_step"],
                     profile_kernels_per_step=gpu.get("kernels_per_step"),
                     profile_idle_frac=gpu["idle"]["idle_frac"] if gpu.get("status") == "ok" else None,
                     profile_busy_bandwidth_frac=gpu.get("busy_bandwidth_frac"))
        bench.log(f"{r.name}: decode profile: {s['verdict']} ({folder / 'summary.md'})")
