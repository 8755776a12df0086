"""`kiln bench predict`: prediction rows from measured points that are already on disk.

Reads the point rows of a `kiln bench scale` results.json, or of the older table format (rows
with strategy, world, step_ms, throughput_per_device, global_batch and no `kind`, as the first
committed ViT-B/16 scaling results have), optionally a `kiln bench comm` results.json for measured latency,
bandwidth and overlap cost, and writes the same prediction rows `kiln bench scale` would, each with
its error against the measured point at its world size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kiln.bench.scale.predict import Phases
from kiln.bench.scale.scale_analysis import analyse_points, overlap_cost, prediction_rows, topology
from kiln.bench.scale.scale_report import write_scale_results
from kiln.distributed.traffic import StepTraffic
from kiln.errors import ConfigError


def _read(path: Path, flag: str) -> dict:
    if not path.exists():
        raise ConfigError(flag, f"{path} does not exist")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(flag, f"{path} is not a results.json ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise ConfigError(flag, f"{path} has no `results` list")
    return data


def point_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Measured point rows in `kiln bench scale`'s form (older rows are converted)."""
    out = []
    for r in rows:
        kind = r.get("kind", "point")
        if kind != "point" or r.get("status") != "ok" or r.get("step_ms") is None:
            continue
        strategy = r.get("strategy") or "none"
        world = int(r["world"])
        row = {k: r.get(k) for k in ("step_ms", "throughput", "throughput_per_device", "peak_mem_bytes")}
        batch = r.get("batch_per_rank") or (r.get("global_batch") or 0) // world
        baseline = r.get("role") == "baseline" or (strategy == "none" and world == 1)
        out.append({**row, "kind": "point", "status": "ok", "strategy": strategy, "variant": r.get("variant", strategy),
                    "world": world, "batch_per_rank": batch, "role": "baseline" if baseline else r.get("role", "point"),
                    "source": r.get("run") or r.get("run_dir")})
    if not any(r["role"] == "baseline" for r in out):
        raise ConfigError("--points", "no one-process baseline row (strategy none, world 1) among the measured points")
    return out


def run_offline_prediction(*, points: Path, comm: Path | None, traffic: dict[str, StepTraffic], mode: str,
                           thresholds: dict[int, float], topo, phases: Phases, predict_worlds: list[int],
                           calibrate_at: int | None, device_type: str, out: Path, command: str):
    measured = _read(points, "--points")
    rows = point_rows(measured["results"])
    comm_rows = [r for r in _read(comm, "--comm")["results"] if r.get("kind") in ("comm", "comm_fit", "overlap")] \
        if comm else []
    missing = [v for v in traffic if not any(r["variant"] == v for r in rows)]
    if missing:
        raise ConfigError("--strategies", f"no measured points of {missing} in {points}",
                          sorted({r["variant"] for r in rows}))
    analyse_points(rows, thresholds, mode)
    link = topology(comm_rows, device_type=device_type, gpus_per_node=topo.gpus_per_node or 8, bus_bw=topo.bus_bw,
                    intra_latency_s=topo.intra_latency_s, inter_bw=topo.inter_bw, inter_latency_s=topo.inter_latency_s)
    worlds = sorted({r["world"] for r in rows if r["world"] > 1} | set(predict_worlds))
    rows += comm_rows
    rows += prediction_rows(rows, traffic, worlds, link, cost=overlap_cost(comm_rows, topo.overlap_cost), mode=mode,
                            thresholds=thresholds, phases=phases, calibrate_at=calibrate_at)
    title = f"kiln bench predict: {points}"
    config = {"points": str(points), "comm": str(comm) if comm else None, "mode": mode, "calibrate_at": calibrate_at,
              "topology": {"gpus_per_node": link.gpus_per_node, "inter_bw": link.inter_bw,
                           "inter_latency_s": link.inter_latency_s,
                           "intra": {op: vars(c) for op, c in link.intra.items()}},
              "phases": vars(phases), "variants": list(traffic), "source_env": measured.get("env")}
    written = write_scale_results(out, rows, env=measured.get("env") or {}, config=config, command=command, title=title)
    return rows, written, title
