"""The scaling model: collective costs (ring/tree, intra/inter-node), the DDP and FSDP2 schedules,
calibration. Pure arithmetic on hand-built traffic, so every expected value is worked out here."""

from __future__ import annotations

import math

import pytest

from kiln.bench.scale.predict import (
    OPS,
    LinkCost,
    Phases,
    Topology,
    bus_factor,
    calibrate_t1,
    collective_time,
    predict_step,
)
from kiln.distributed.traffic import Collective, StepTraffic

GB = 1e9


def topo(busbw=100 * GB, hop=1e-6, per_node=8, inter_bw=10 * GB, inter_hop=10e-6) -> Topology:
    return Topology(per_node, {op: LinkCost(hop, busbw, "given") for op in OPS}, inter_bw, inter_hop)


def ddp(*nbytes: int) -> StepTraffic:
    total = sum(nbytes)
    return StepTraffic("ddp", tuple(Collective("all_reduce", n, "backward", n / total, f"b{i}")
                                    for i, n in enumerate(nbytes)), total)


def fsdp(units: int, unit_bytes: int, reshard: bool = True) -> StepTraffic:
    share = 1 / units
    fwd = [Collective("all_gather", unit_bytes, "forward", share, f"u{i}") for i in range(units)]
    bwd = []
    for i in reversed(range(units)):
        if reshard and i < units - 1:
            bwd.append(Collective("all_gather", unit_bytes, "backward", share, f"u{i}"))
        bwd.append(Collective("reduce_scatter", 2 * unit_bytes, "backward", share, f"u{i}"))
    return StepTraffic("fsdp", tuple(fwd + bwd), units)


def test_bus_factors_follow_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("reduce_scatter", 2) == pytest.approx(0.5)


def test_ring_cost_inside_one_node():
    t, algo = collective_time("all_reduce", 10**9, 4, topo())
    # 2 passes x 3 hops x 1 us + 1 GB * 2*3/4 / 100 GB/s
    assert algo == "ring"
    assert t == pytest.approx(6e-6 + 1.5e9 / 100e9)
    t, _ = collective_time("all_gather", 10**9, 4, topo())
    assert t == pytest.approx(3e-6 + 0.75e9 / 100e9)
    assert collective_time("all_reduce", 10**9, 1, topo()) == (0.0, "none")


def test_across_nodes_the_ring_is_limited_by_the_nodes_nics():
    t, algo = collective_time("all_gather", 10**9, 16, topo(inter_bw=10 * GB))
    # 2 nodes of 8: bandwidth min(100, 8 * 10) = 80 GB/s; hops: 14 intra, 2 inter
    assert algo == "ring"
    assert t == pytest.approx(14e-6 + 2 * 10e-6 + 10**9 * 15 / 16 / 80e9)


def test_small_all_reduce_across_many_nodes_takes_the_tree():
    t, algo = collective_time("all_reduce", 4096, 1024, topo())
    assert algo == "tree"
    nodes = 128
    assert t == pytest.approx(2 * (math.log2(nodes) * 10e-6 + 7 * 1e-6) + 4096 * 2 * 1023 / 1024 / 80e9)
    ring, _ = collective_time("all_gather", 4096, 1024, topo())  # no tree for all-gather: latency grows
    assert ring > 1023 * 1e-6


def test_no_communication_predicts_the_one_rank_step():
    p = predict_step(ddp(1000, 1000), 0.02, 1, topo(), overlap_cost=0.5)
    assert p.step_s == pytest.approx(0.02) and p.comm_s == 0 and p.exposed_s == 0


def test_ddp_hides_buckets_behind_backward_and_exposes_the_tail():
    phases = Phases(backward_share=0.6, rest_share=0.1)
    t1 = 0.1  # forward 30 ms, backward 60 ms, rest 10 ms
    tr = ddp(*[10**8] * 4)  # 4 buckets, each 1.5e8 B on the wire at n=4 -> 1.5 ms at 100 GB/s
    p = predict_step(tr, t1, 4, topo(hop=0), overlap_cost=0.0, phases=phases)
    per_bucket = 10**8 * 1.5 / 100e9
    # Buckets are ready at 45, 60, 75, 90 ms; each takes 1.5 ms: only the last one outlasts backward.
    assert p.comm_s == pytest.approx(4 * per_bucket)
    assert p.exposed_s == pytest.approx(per_bucket)
    assert p.step_s == pytest.approx(t1 + per_bucket)
    assert p.overlapped_s == pytest.approx(3 * per_bucket)
    charged = predict_step(tr, t1, 4, topo(hop=0), overlap_cost=0.5, phases=phases)
    assert charged.step_s == pytest.approx(t1 + per_bucket + 0.5 * 3 * per_bucket)


def test_ddp_communication_longer_than_backward_is_exposed():
    tr = ddp(10**10)  # one bucket, 1.5e10 B on the wire at n=4: 150 ms
    p = predict_step(tr, 0.1, 4, topo(hop=0), overlap_cost=0.0, phases=Phases(0.6, 0.1))
    assert p.exposed_s == pytest.approx(0.15)


def test_fsdp_prefetch_hides_gathers_shorter_than_a_unit():
    t1, units = 0.12, 4
    fast = predict_step(fsdp(units, 10**6), t1, 8, topo(hop=0), overlap_cost=0.0)
    # Only the first forward gather (nothing to hide behind) and the last reduce-scatter are exposed.
    first = 10**6 * 7 / 8 / 100e9
    last = 2 * 10**6 * 7 / 8 / 100e9
    assert fast.exposed_s == pytest.approx(first + last, rel=1e-6)
    slow = predict_step(fsdp(units, 10**10), t1, 8, topo(hop=0), overlap_cost=0.0)
    assert slow.exposed_s > slow.comm_s - t1  # longer than compute: the step is communication-bound
    assert slow.step_s > fast.step_s


def test_fsdp_keeping_units_gathered_drops_backward_gathers():
    zero3 = predict_step(fsdp(4, 10**8), 0.1, 8, topo(), overlap_cost=0.0)
    zero2 = predict_step(fsdp(4, 10**8, reshard=False), 0.1, 8, topo(), overlap_cost=0.0)
    gather = collective_time("all_gather", 10**8, 8, topo())[0]
    assert zero3.comm_s - zero2.comm_s == pytest.approx(3 * gather)


def test_more_bandwidth_never_predicts_a_slower_step():
    tr = fsdp(6, 3 * 10**8)
    steps = [predict_step(tr, 0.05, 64, topo(busbw=bw * GB, inter_bw=bw / 4 * GB), overlap_cost=0.2).step_s
             for bw in (25, 50, 100, 200, 400)]
    assert steps == sorted(steps, reverse=True)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_calibration_inverts_the_prediction(strategy):
    tr = ddp(*[4 * 10**8] * 3) if strategy == "ddp" else fsdp(5, 4 * 10**8)
    true_t1 = 0.03
    measured = predict_step(tr, true_t1, 4, topo(), overlap_cost=0.3).step_s
    assert measured > true_t1
    assert calibrate_t1(tr, measured, 4, topo(), overlap_cost=0.3) == pytest.approx(true_t1, rel=1e-6)


def test_calibration_refuses_a_step_shorter_than_the_communication_alone():
    tr = ddp(*[4 * 10**8] * 3)
    comm_only = predict_step(tr, 0.0, 4, topo(), overlap_cost=0.3).step_s
    assert comm_only > 0
    assert calibrate_t1(tr, comm_only * 0.5, 4, topo(), overlap_cost=0.3) is None
    assert calibrate_t1(tr, comm_only, 4, topo(), overlap_cost=0.3) == pytest.approx(0.0, abs=1e-9)
