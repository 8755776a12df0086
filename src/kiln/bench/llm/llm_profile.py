"""`kiln bench llm --profile-decode N` and `--profile-prefill N`: after the timed rounds, a profiled
window of decode steps (kiln.profile.decode) or of prefills (kiln.profile.prefill) per kiln row, in
its own folder, with its figures on the row."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kiln.bench.row_failure import failure
from kiln.llm.weights import decode_weight_bytes


def _kiln_rows(ready: list, root: str) -> Iterator[tuple[Any, Path]]:
    """(row, its folder under `root`) for each kiln row that is still ok."""
    for r in ready:
        if r.ok and r.engine_name.startswith("kiln"):
            yield r, Path(root) / re.sub(r"[^A-Za-z0-9_.-]+", "_", r.name).strip("_")


def profile_rows(bench, ready: list) -> None:
    """After timing: a profiled decode window per kiln row, in its own folder under profile_dir."""
    for r, folder in _kiln_rows(ready, bench.opts.profile_dir):
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


def profile_prefill_rows(bench, ready: list) -> None:
    """After timing: a profiled window of prefills per kiln row, in its own folder under prefill_profile_dir."""
    for r, folder in _kiln_rows(ready, bench.opts.prefill_profile_dir):
        flops = bench.prompt_flops * r.row.batch if bench.prompt_flops else None
        title = f"Prefill profile: {r.name}, {bench.opts.model} ({bench.opts.dtype}, batch {r.row.batch})"
        try:
            s = r.engine.profile_prefill(bench.opts.profile_prefill, folder, flops_per_call=flops, title=title,
                                         matmul_flops_per_s=bench.ceilings.matmul_flops_per_s if bench.ceilings else None)
        except Exception as exc:
            r.row.prefill_profile_error = failure(exc)[1]
            bench.log(f"{r.name}: prefill profile failed ({r.row.prefill_profile_error})")
            continue
        gpu = s["gpu"]
        ok = gpu.get("status") == "ok"
        r.row.update(prefill_profile=str(folder / "summary.md"), prefill_profile_verdict=s["verdict"],
                     prefill_profile_ms=s["wall_ms_per_call"],
                     prefill_profile_gpu_busy_ms=gpu["idle"]["busy_ms_per_step"] if ok else None,
                     prefill_profile_idle_frac=gpu["idle"]["idle_frac"] if ok else None,
                     prefill_profile_host_ms=s["cpu"]["cpu_self_ms_per_step"])
        bench.log(f"{r.name}: prefill profile: {s['verdict']} ({folder / 'summary.md'})")
