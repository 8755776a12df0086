"""From measured rows to the scaling table: efficiency, step-time breakdown, thresholds, and the
prediction rows (kiln.bench.scale.predict) with their error against every measured point.

Definitions (docs/guide/bench.md says the same):
- efficiency = throughput per device at N / throughput per device of the baseline, the one-process
  run without any wrapper (weak scaling: same per-rank batch; strong: same global batch, so this is
  T_base / (N * T_N)). A wrapper's own cost at one rank therefore counts against it. Without a
  1-rank baseline (rank counts from 2 up: a model one GPU cannot hold), the same ratio against the
  variant's own point at the smallest rank count (`efficiency_base` names which).
- efficiency_vs_1rank: the same against the variant's own 1-rank point (the definition scaling
  tables of plain PyTorch usually use).
- compute_ms: the variant's step at ONE rank with the same per-rank batch: the same work, hooks and
  graph splits, but no peers, so no communication time. exposed_comm_ms = step_ms - compute_ms:
  the communication (and waiting for the slowest rank) that the step did not hide.
  wrapper_ms = compute_ms - baseline step: what the wrapper costs by itself (weak scaling).
"""

from __future__ import annotations

from typing import Any

from kiln.bench.scale.predict import OPS, LinkCost, Phases, Topology, calibrate_t1, predict_step, ring_hops
from kiln.bench.scale.scale_plan import threshold_for
from kiln.distributed.traffic import StepTraffic

# Defaults when nothing was measured (one GPU, or --no-comm): given, and labelled so in the rows.
GIVEN = {
    # NCCL all-reduce bus bandwidth at large messages on an 8-GPU NVLink node (H200 class).
    "cuda": {"busbw": 340e9, "hop_latency_s": 2e-6},
    "cpu": {"busbw": 2e9, "hop_latency_s": 50e-6},
}
DEFAULT_INTER_BW = 45e9  # one 400 Gb/s NIC per GPU at ~90 % of line rate
DEFAULT_INTER_LATENCY_S = 5e-6
# NCCL's channels hold 16-32 of an H100's 132 SMs while they run: compute beside a collective loses
# about that share. Used only when the overlap probe did not run (one GPU).
DEFAULT_OVERLAP_COST = 0.15


def _ok(rows: list[dict], **match) -> list[dict]:
    return [r for r in rows if r.get("status") == "ok" and all(r.get(k) == v for k, v in match.items())]


def analyse_points(rows: list[dict[str, Any]], thresholds: dict[int, float], mode: str) -> None:
    """Adds efficiency, breakdown and threshold columns to the point rows, in place."""
    base = next(iter(_ok(rows, kind="point", role="baseline")), None)
    for r in (r for r in rows if r.get("kind") == "point" and r.get("status") == "ok"):
        if r["role"] == "reference":  # strong scaling's 1-rank compute at a smaller batch: an input only
            continue
        eff_base = base or smallest_point(rows, r["variant"])
        if eff_base is not None:
            r["efficiency"] = r["throughput_per_device"] / eff_base["throughput_per_device"]
            r["efficiency_base"] = f"{eff_base['variant']} x{eff_base['world']}"
        if base is not None and base.get("peak_mem_bytes") and r.get("peak_mem_bytes"):
            r["mem_vs_single"] = r["peak_mem_bytes"] / base["peak_mem_bytes"]
        if r["role"] == "baseline":
            r["compute_ms"] = r["step_ms"]
            continue
        one = next(iter(_ok(rows, kind="point", variant=r["variant"], world=1, role="point")), None)
        if one is not None:
            r["efficiency_vs_1rank"] = r["throughput_per_device"] / one["throughput_per_device"]
        ref = one if mode == "weak" or r["world"] == 1 else next(
            iter(_ok(rows, kind="point", variant=r["variant"], world=1, role="reference", batch_per_rank=r["batch_per_rank"])),
            None)
        if ref is not None:
            r["compute_ms"] = ref["step_ms"]
            if r["world"] > 1:
                r["exposed_comm_ms"] = r["step_ms"] - ref["step_ms"]
        if base is not None and r.get("compute_ms") is not None and r["batch_per_rank"] == base["batch_per_rank"]:
            r["wrapper_ms"] = r["compute_ms"] - base["step_ms"]
        if eff_base is not r:  # a point that is its own efficiency base has no bar to pass
            apply_threshold(r, thresholds)


def smallest_point(rows: list[dict[str, Any]], variant: str) -> dict[str, Any] | None:
    """The variant's measured point at its smallest rank count: the efficiency base without a
    1-rank baseline."""
    points = _ok(rows, kind="point", variant=variant, role="point")
    return min(points, key=lambda r: r["world"]) if points else None


def apply_threshold(row: dict[str, Any], thresholds: dict[int, float]) -> None:
    bar = threshold_for(row["world"], thresholds)
    if bar is not None and row.get("efficiency") is not None:
        row["threshold"] = bar
        row["pass"] = row["efficiency"] >= bar


def topology(comm_rows: list[dict], *, device_type: str, gpus_per_node: int, bus_bw: float | None = None,
             intra_latency_s: float | None = None, inter_bw: float | None = None,
             inter_latency_s: float | None = None) -> Topology:
    """Per collective: the measured fit (comm_fit rows), else the measured all-reduce's, else given
    values; flags given explicitly win over measurements."""
    fits = {r["op"]: r for r in comm_rows if r.get("kind") == "comm_fit" and r.get("status") == "ok"}
    given = GIVEN["cuda" if device_type == "cuda" else "cpu"]
    intra = {}
    for op in OPS:
        fit = fits.get(op) or fits.get("all_reduce")
        if fit is not None:
            measured_as = fit["op"]
            hop = fit["latency_us"] * 1e-6 / max(1, ring_hops(measured_as, fit["world"]))
            link = LinkCost(hop, fit["busbw_GBps"] * 1e9, f"measured {measured_as} ({fit['world']} ranks)")
        else:
            link = LinkCost(given["hop_latency_s"], given["busbw"], "given")
        if bus_bw is not None or intra_latency_s is not None:
            link = LinkCost(intra_latency_s if intra_latency_s is not None else link.hop_latency_s,
                            bus_bw if bus_bw is not None else link.busbw, "given")
        intra[op] = link
    return Topology(gpus_per_node, intra,
                    inter_bw if inter_bw is not None else DEFAULT_INTER_BW,
                    inter_latency_s if inter_latency_s is not None else DEFAULT_INTER_LATENCY_S)


def overlap_cost(comm_rows: list[dict], given: float | None) -> tuple[float, str]:
    if given is not None:
        return given, "given"
    probe = next((r for r in comm_rows if r.get("kind") == "overlap" and r.get("status") == "ok"), None)
    if probe is not None:
        return probe["overlap_cost"], f"measured ({probe['world']} ranks)"
    return DEFAULT_OVERLAP_COST, "given (default)"


def _t1(rows: list[dict], variant: str, base: dict | None, calibrate_at: int | None, traffic: StepTraffic,
        topo: Topology, cost: float, phases: Phases, mode: str) -> tuple[float | None, str]:
    """The variant's 1-rank step (s) at the baseline's batch, and where it came from."""
    why_not = ""
    if calibrate_at is not None:
        at = next(iter(_ok(rows, kind="point", variant=variant, world=calibrate_at, role="point")), None)
        if at is not None:
            t1 = calibrate_t1(traffic, at["step_ms"] / 1e3, calibrate_at, topo, overlap_cost=cost, phases=phases)
            if t1 is not None:
                # Strong scaling ran that point at batch B/N: back to the full batch, as predictions expect.
                return t1 * (calibrate_at if mode == "strong" else 1), f"calibrated on the {calibrate_at}-rank point"
            floor = predict_step(traffic, 0.0, calibrate_at, topo, overlap_cost=cost, phases=phases).step_s
            why_not = (f" (not calibrated on the {calibrate_at}-rank point: the model's communication alone, "
                       f"{floor * 1e3:.3g} ms, exceeds its measured {at['step_ms']:.3g} ms step; the bandwidth "
                       "used is too pessimistic)")
    one = next(iter(_ok(rows, kind="point", variant=variant, world=1, role="point")), None)
    if one is not None:
        return one["step_ms"] / 1e3, "measured at 1 rank" + why_not
    tried = any(r.get("kind") == "point" and r.get("variant") == variant and r.get("world") == 1 for r in rows)
    if base is not None and not tried:
        return base["step_ms"] / 1e3, "baseline step (the wrapper's own cost unknown: taken as 0)" + why_not
    return None, ""


def _calibrated_base(rows: list[dict], variant: str, t1: float | None, mode: str) -> dict[str, Any] | None:
    """Without a 1-rank baseline: the variant's calibrated 1-rank step at its smallest point's
    batch (weak) or global batch (strong), where its predictions start (their efficiency is then
    against that smallest point, as the measured points' is)."""
    first = smallest_point(rows, variant)
    if t1 is None or first is None:
        return None
    batch = first["batch_per_rank"] * (first["world"] if mode == "strong" else 1)
    return {"step_ms": t1 * 1e3, "batch_per_rank": batch}


def prediction_rows(rows: list[dict], traffic: dict[str, StepTraffic], worlds: list[int], topo: Topology, *,
                    cost: tuple[float, str], mode: str, thresholds: dict[int, float], phases: Phases = Phases(),
                    calibrate_at: int | None = None) -> list[dict[str, Any]]:
    """One row per (variant, world): predicted step, efficiency, and the error against the measured
    point at that world where there is one. `traffic` maps variant name -> its StepTraffic."""
    baseline = next(iter(_ok(rows, kind="point", role="baseline")), None)
    out = []
    for variant, tr in traffic.items():
        t1, t1_source = _t1(rows, variant, baseline, calibrate_at, tr, topo, cost[0], phases, mode)
        base = baseline or _calibrated_base(rows, variant, t1, mode)
        smallest = smallest_point(rows, variant)  # without a baseline: the measured efficiencies' base
        for world in worlds:
            row: dict[str, Any] = {"kind": "prediction", "variant": variant, "strategy": tr.strategy, "world": world,
                                   "nodes": -(-world // topo.gpus_per_node)}
            if t1 is None or base is None:
                out.append({**row, "status": "skipped", "reason": "no 1-rank step of this variant (failed, skipped "
                            "or not measured) and no baseline to start from"})
                continue
            batch = base["batch_per_rank"] if mode == "weak" else base["batch_per_rank"] / world
            if mode == "strong" and batch < 1:
                out.append({**row, "status": "skipped", "reason": f"global batch {base['batch_per_rank']} < {world} ranks"})
                continue
            scale = 1.0 if mode == "weak" else 1.0 / world
            p = predict_step(tr, t1 * scale, world, topo, overlap_cost=cost[0], phases=phases)
            step = p.step_s
            row.update({
                "status": "ok", "batch_per_rank": batch, "step_ms": step * 1e3, "compute_ms": p.compute_s * 1e3,
                "comm_ms": p.comm_s * 1e3, "exposed_comm_ms": p.exposed_s * 1e3,
                "overlap_cost_ms": p.contention_s * 1e3, "throughput_per_device": batch / step,
                "throughput": batch * world / step,
                "efficiency": (base["step_ms"] / 1e3) / (step * (world if mode == "strong" else 1)) if baseline
                else (batch / step) / smallest["throughput_per_device"],
                "algorithm": ",".join(f"{k}:{v}" for k, v in sorted(p.algorithms.items())),
                "t1_source": t1_source, "bw_source": topo.intra["all_reduce"].source, "overlap_source": cost[1],
            })
            measured = next(iter(_ok(rows, kind="point", variant=variant, world=world, role="point")), None)
            if measured is not None and measured.get("efficiency") is not None:
                row["measured_efficiency"] = measured["efficiency"]
                row["error_points"] = (row["efficiency"] - measured["efficiency"]) * 100
            apply_threshold(row, thresholds)
            out.append(row)
    return out
