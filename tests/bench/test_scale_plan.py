"""`kiln bench scale` input parsing, point planning and the scaling arithmetic on hand-made rows."""

from __future__ import annotations

import pytest

from kiln.bench.scale.comm import fit_latency_bandwidth, plan_sizes
from kiln.bench.scale.predict import bus_factor
from kiln.bench.scale.scale_analysis import analyse_points, topology
from kiln.bench.scale.scale_plan import (
    Variant,
    parse_nprocs,
    parse_strategies,
    parse_thresholds,
    parse_variant,
    plan_points,
    threshold_for,
)
from kiln.config import load_config
from kiln.distributed.traffic import Collective, StepTraffic
from kiln.errors import ConfigError


def test_parsers_accept_the_documented_forms():
    assert parse_nprocs("4,1,2,2") == [1, 2, 4]
    assert parse_thresholds("2:85,4:80,8:0.75") == {2: 0.85, 4: 0.80, 8: 0.75}
    assert [v.name for v in parse_strategies("fsdp,ddp,fsdp")] == ["fsdp", "ddp"]
    v = parse_variant("fsdp-zero2=fsdp,distributed.fsdp_reshard_after_forward=false")
    assert v == Variant("fsdp-zero2", "fsdp", ("distributed.fsdp_reshard_after_forward=false",))
    assert v.config_overrides()[-1] == "distributed.strategy=fsdp"


@pytest.mark.parametrize(("fn", "text", "flag"), [
    (parse_nprocs, "0,2", "--nprocs"), (parse_nprocs, "two", "--nprocs"),
    (parse_thresholds, "2=85", "--thresholds"), (parse_thresholds, "2:120", "--thresholds"),
    (parse_strategies, "dp", "--strategies"), (parse_variant, "x=zero3", "--variant"),
    (parse_variant, "x=fsdp,distributed.strategy=ddp", "--variant"), (parse_variant, "fsdp", "--variant"),
])
def test_parsers_name_the_flag_on_bad_input(fn, text, flag):
    with pytest.raises(ConfigError) as err:
        fn(text)
    assert err.value.key == flag


def test_thresholds_hold_beyond_the_largest_world():
    bars = {2: 0.85, 4: 0.80, 8: 0.75}
    assert [threshold_for(n, bars) for n in (1, 2, 3, 4, 8, 16, 1024)] == [None, 0.85, None, 0.80, 0.75, 0.75, 0.75]


def test_points_beyond_the_machine_are_skipped_with_the_reason():
    cfg = load_config(None, ["data.batch_size=8"])
    variants = parse_strategies("ddp,fsdp")
    pts = plan_points(cfg, variants, [1, 2, 4, 8], mode="weak", device_type="cuda", slots=4)
    assert pts[0].role == "baseline" and pts[0].variant.name == "none" and pts[0].skip is None
    skipped = {(p.variant.name, p.world): p.skip for p in pts if p.skip}
    assert set(skipped) == {("ddp", 8), ("fsdp", 8)}
    assert "needs 8 GPUs" in skipped[("ddp", 8)] and "4 visible" in skipped[("ddp", 8)]
    cpu = plan_points(cfg, variants[:1], [1, 2, 4], mode="weak", device_type="cpu", slots=2)
    assert "gloo ranks" in next(p.skip for p in cpu if p.world == 4)
    no_fsdp = plan_points(cfg, variants, [1], mode="weak", device_type="cpu", slots=2, fsdp_ok=False)
    assert "FSDP2" in next(p.skip for p in no_fsdp if p.variant.name == "fsdp")


def test_strong_scaling_splits_the_global_batch_and_adds_one_rank_references():
    cfg = load_config(None, ["data.batch_size=12"])
    pts = plan_points(cfg, parse_strategies("ddp"), [1, 2, 3, 8], mode="strong", device_type="cuda", slots=8)
    got = {(p.world, p.batch, p.role): p.skip for p in pts}
    assert got[(2, 6, "point")] is None and got[(1, 6, "reference")] is None
    assert got[(3, 4, "point")] is None and got[(1, 4, "reference")] is None
    assert "does not split" in got[(8, 12, "point")]


def _point(variant, world, step_ms, batch=8, role="point", **extra):
    return {"kind": "point", "status": "ok", "variant": variant, "strategy": variant if variant != "none" else "none",
            "world": world, "role": role, "batch_per_rank": batch, "step_ms": step_ms,
            "throughput_per_device": batch / step_ms * 1e3, **extra}


def test_efficiency_and_breakdown_against_the_baseline():
    rows = [_point("none", 1, 20.0, role="baseline", peak_mem_bytes=100), _point("ddp", 1, 22.0),
            _point("ddp", 4, 25.0, peak_mem_bytes=110), {"kind": "point", "status": "skipped", "variant": "ddp",
                                                         "world": 8, "role": "point"}]
    analyse_points(rows, {2: 0.85, 4: 0.80}, "weak")
    four = rows[2]
    assert four["efficiency"] == pytest.approx(20 / 25)
    assert four["efficiency_vs_1rank"] == pytest.approx(22 / 25)
    assert four["compute_ms"] == 22.0 and four["exposed_comm_ms"] == pytest.approx(3.0)
    assert four["wrapper_ms"] == pytest.approx(2.0)
    assert four["threshold"] == 0.80 and four["pass"] is True
    assert four["mem_vs_single"] == pytest.approx(1.1)
    assert rows[1]["efficiency"] == pytest.approx(20 / 22) and "exposed_comm_ms" not in rows[1]
    assert "efficiency" not in rows[3]


def test_strong_scaling_efficiency_and_reference_compute():
    rows = [_point("none", 1, 40.0, batch=16, role="baseline"), _point("ddp", 1, 41.0, batch=16),
            _point("ddp", 4, 12.0, batch=4), _point("ddp", 1, 11.0, batch=4, role="reference")]
    analyse_points(rows, {}, "strong")
    assert rows[2]["efficiency"] == pytest.approx(40 / (4 * 12))
    assert rows[2]["compute_ms"] == 11.0 and rows[2]["exposed_comm_ms"] == pytest.approx(1.0)


def test_bandwidth_fit_recovers_latency_and_busbw():
    world, alpha, busbw = 4, 20e-6, 150e9
    rows = []
    for nbytes in (4096, 2**20, 2**24, 2**27):
        t = alpha + nbytes * bus_factor("all_gather", world) / busbw
        rows.append({"kind": "comm", "status": "ok", "op": "all_gather", "bytes": nbytes, "world": world,
                     "time_us": t * 1e6})
    (fit,) = fit_latency_bandwidth(rows)
    assert fit["latency_us"] == pytest.approx(20, rel=1e-6)
    assert fit["busbw_GBps"] == pytest.approx(150, rel=1e-6)
    link = topology([fit], device_type="cuda", gpus_per_node=8).intra
    # Per-hop latency: the ring of 4 ranks has 3 hops; an op that was not measured borrows all-reduce's
    # (none here: it falls back to the given default).
    assert link["all_gather"].hop_latency_s == pytest.approx(20e-6 / 3)
    assert link["all_reduce"].source == "given"
    assert topology([fit], device_type="cuda", gpus_per_node=8, bus_bw=1e9).intra["all_gather"].busbw == 1e9


def test_comm_sizes_are_the_traffic_sizes_plus_a_sweep():
    t = StepTraffic("ddp", (Collective("all_reduce", 3 * 2**20, "backward", 0.5, "b1"),
                            Collective("all_reduce", 3 * 2**20, "backward", 0.5, "b2")), 10)
    sizes = plan_sizes([t])
    model = [s for s in sizes if s.per_step]
    assert [(s.op, s.nbytes, s.per_step) for s in model] == [("all_reduce", 3 * 2**20, {"ddp": 2})]
    assert {s.nbytes for s in sizes if not s.per_step} == {4096, 32768, 262144, 2097152}
    assert plan_sizes([t], sweep=False) == model


def test_strong_scaling_predictions_and_calibration():
    from kiln.bench.scale.predict import OPS, LinkCost, Topology, predict_step
    from kiln.bench.scale.scale_analysis import prediction_rows

    rows = [_point("none", 1, 40.0, batch=16, role="baseline"), _point("ddp", 1, 41.0, batch=16),
            _point("ddp", 4, 12.0, batch=4)]
    analyse_points(rows, {}, "strong")
    traffic = {"ddp": StepTraffic("ddp", (Collective("all_reduce", 10**8, "backward", 1.0, "b1"),), 1)}
    topo = Topology(8, {op: LinkCost(1e-6, 100e9, "given") for op in OPS}, 10e9, 5e-6)
    (four,) = prediction_rows(rows, traffic, [4], topo, cost=(0.2, "given"), mode="strong", thresholds={})
    expected = predict_step(traffic["ddp"], 0.041 / 4, 4, topo, overlap_cost=0.2).step_s
    assert four["batch_per_rank"] == 4 and four["step_ms"] == pytest.approx(expected * 1e3)
    assert four["efficiency"] == pytest.approx(0.040 / (4 * expected))
    assert four["error_points"] == pytest.approx((four["efficiency"] - 40 / 48) * 100)
    (cal,) = prediction_rows(rows, traffic, [4], topo, cost=(0.2, "given"), mode="strong", thresholds={},
                             calibrate_at=4)
    assert cal["step_ms"] == pytest.approx(12.0) and cal["error_points"] == pytest.approx(0.0, abs=1e-6)
    slow = Topology(8, {op: LinkCost(1e-6, 1e9, "given") for op in OPS}, 10e9, 5e-6)  # 0.1 GB all-reduce: > 12 ms
    (fallback,) = prediction_rows(rows, traffic, [4], slow, cost=(0.2, "given"), mode="strong", thresholds={},
                                  calibrate_at=4)
    assert fallback["t1_source"].startswith("measured at 1 rank (not calibrated on the 4-rank point")
    assert "exceeds its measured 12 ms step" in fallback["t1_source"]


def test_rank_counts_from_two_plan_no_one_rank_point_and_measure_against_the_smallest():
    """An 8B does not fit one GPU: `--nprocs 2,4` tries no 1-rank baseline or reference, and each
    variant's efficiency (measured and predicted) is against its own 2-rank point."""
    from kiln.bench.scale.predict import OPS, LinkCost, Topology, calibrate_t1
    from kiln.bench.scale.scale_analysis import prediction_rows

    cfg = load_config(None, ["data.batch_size=8"])
    for mode in ("weak", "strong"):
        pts = plan_points(cfg, parse_strategies("fsdp"), [2, 4], mode=mode, device_type="cuda", slots=4)
        assert [p.world for p in pts] == [2, 4] and all(p.role == "point" for p in pts)
    rows = [_point("fsdp", 2, 20.0), _point("fsdp", 4, 25.0)]
    analyse_points(rows, {4: 0.8}, "weak")
    assert rows[0]["efficiency"] == 1.0 and rows[1]["efficiency"] == pytest.approx(20 / 25)
    assert rows[1]["efficiency_base"] == "fsdp x2" and rows[1]["pass"] is True
    only = [_point("fsdp", 4, 25.0)]  # `--nprocs 4` alone: the point is its own base, no bar passed
    analyse_points(only, {4: 0.8}, "weak")
    assert only[0]["efficiency"] == 1.0 and "pass" not in only[0] and "threshold" not in only[0]
    assert "compute_ms" not in rows[1] and "mem_vs_single" not in rows[1]
    traffic = {"fsdp": StepTraffic("fsdp", (Collective("all_gather", 10**7, "forward", 1.0, "u1"),), 1)}
    topo = Topology(8, {op: LinkCost(1e-6, 100e9, "given") for op in OPS}, 10e9, 5e-6)
    two, four = prediction_rows(rows, traffic, [2, 4], topo, cost=(0.2, "given"), mode="weak", thresholds={},
                                calibrate_at=2)
    assert two["t1_source"] == "calibrated on the 2-rank point"
    assert two["step_ms"] == pytest.approx(20.0) and two["efficiency"] == pytest.approx(1.0)
    t1 = calibrate_t1(traffic["fsdp"], 0.020, 2, topo, overlap_cost=0.2)
    assert four["compute_ms"] == pytest.approx(t1 * 1e3)
    assert four["efficiency"] == pytest.approx(20.0 / four["step_ms"])
    assert four["error_points"] == pytest.approx((four["efficiency"] - 0.8) * 100)


def test_the_8b_from_two_ranks_checks_on_the_meta_device_and_calibrates_at_two(tmp_path):
    """`kiln bench scale --model llama:llama-3.1-8b --nprocs 2,4`: the check builds the 8B only on
    the meta device (its FSDP traffic), plans no 1-rank point and starts predictions at 2 ranks."""
    from kiln.bench.scale.scale_command import check_scale
    from kiln.bench.scale.scale_request import ScaleRequest

    job = check_scale(ScaleRequest(model="llama:llama-3.1-8b", nprocs="2,4", strategies="fsdp", out=str(tmp_path / "o"),
                                   overrides=["data.seq_len=8192", "data.batch_size=1", "training.device=cpu"]))
    assert [p.world for p in job.opts.plan.points] == [2, 4] and job.opts.calibrate_at == 2


def test_predictions_take_the_reshard_choice_the_points_ran_with():
    """Under `auto` the memory plan decides on the device; the traffic the predictions use follows
    what the FSDP2 points recorded (summary.json's fsdp_layout), not the config's size rule."""
    from kiln.bench.scale.scale_bench import traffic_as_run, variant_traffic

    overrides = ["model.kwargs.hidden_size=256", "model.kwargs.num_layers=6", "model.kwargs.num_classes=10",
                 "distributed.fsdp_unit_blocks=2", "training.device=cpu"]
    fsdp, ddp = Variant("fsdp", "fsdp"), Variant("ddp", "ddp")
    before = variant_traffic(None, overrides, [fsdp, ddp])

    def regathers(traffic) -> int:
        return sum(1 for c in traffic.collectives if c.op == "all_gather" and c.phase == "backward")

    assert regathers(before["fsdp"]) == 0  # a small model: the size rule keeps it gathered
    point = {"kind": "point", "variant": "fsdp", "status": "ok", "reshard_after_forward": True}
    after = traffic_as_run(before, [point, {**point, "world": 4}], None, overrides, [fsdp, ddp])
    assert regathers(after["fsdp"]) == 2 and after["ddp"] is before["ddp"]  # every unit but the last
    split = [point, {**point, "reshard_after_forward": False}]  # points that disagree keep the config's
    assert traffic_as_run(before, split, None, overrides, [fsdp])["fsdp"] is before["fsdp"]
    failed = [{**point, "status": "error"}]
    assert traffic_as_run(before, failed, None, overrides, [fsdp])["fsdp"] is before["fsdp"]
