"""Trace analysis on hand-made Kineto traces: kinds, idle gaps, self times (exact figures)."""

from __future__ import annotations

import gzip
import json

import pytest

from kiln.profile.profile_summary import summarise_trace
from kiln.profile.trace import (
    cpu_self_times,
    device_events,
    exposed_communication,
    gpu_timeline,
    idle_gaps,
    kernel_table,
    kinds,
    load_trace,
)
from kiln.profile.window_tables import timeline_tables


def k(name, ts, dur, cat="kernel", stream=7):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream}


# Two steps of a launch-bound GPU timeline (microseconds): kernels separated by host launch gaps,
# one overlapping kernel on a second stream, an NCCL all-reduce and a memcpy.
KERNELS = [
    k("triton_poi_fused_gelu_0", 0, 10),
    k("nvjet_tst_128x64_64x4_1x2_h_bz_NNT", 30, 20),          # cuBLAS matmul on H100
    k("triton_tem_fused_addmm_1", 40, 20, stream=9),          # overlaps the previous one
    k("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100, 50),
    k("Memcpy DtoD (Device -> Device)", 150, 5, cat="gpu_memcpy"),
    k("void at::native::vectorized_elementwise_kernel<4>", 400, 15),
]


def test_kinds():
    assert kinds("triton_red_fused_sum_3", "kernel") == {"triton"}
    assert kinds("triton_tem_fused_mm_2", "kernel") == {"triton", "matmul"}
    assert kinds("sm90_xmma_gemm_bf16bf16_bf16f32", "kernel") == {"matmul"}
    assert kinds("ncclDevKernel_AllGather_RING_LL", "kernel") == {"communication"}
    assert kinds("Memset (Device)", "gpu_memset") == {"memset"}
    assert kinds("void at::native::elementwise_kernel", "kernel") == {"other"}
    assert kinds("aten::addmm", "cpu_op") >= {"matmul"}
    # cuDNN's SDPA kernels run wgmma (a matmul pattern) but are attention
    assert kinds("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "kernel") == {"attention"}
    assert kinds("void flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", "kernel") == {"attention"}
    assert kinds("aten::_cudnn_attention_backward", "cpu_op") == {"attention"}
    assert kinds("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT", "kernel") == {"matmul"}


def test_idle_gaps_are_the_complement_of_the_kernel_union():
    idle = idle_gaps(device_events(KERNELS), steps=2)
    # busy: [0,10] [30,60] [100,155] [400,415] = 10 + 30 + 55 + 15 = 110 us of a 415 us span
    assert idle["gpu_span_ms"] == pytest.approx(0.415)
    assert idle["gpu_busy_ms"] == pytest.approx(0.110)
    assert idle["idle_ms"] == pytest.approx(0.305)
    assert idle["idle_frac"] == pytest.approx(305 / 415)
    assert idle["idle_ms_per_step"] == pytest.approx(0.1525)
    assert idle["gaps"] == 3 and idle["gaps_over_10us"] == 3 and idle["gap_us_median"] == 40
    first = idle["largest_gaps"][0]
    assert first["us"] == 245 and first["at_ms"] == pytest.approx(0.155)
    assert first["after"].startswith("Memcpy") and first["before"].startswith("void at::native::vectorized")
    assert [g["us"] for g in idle["largest_gaps"]] == [245, 40, 20]
    assert idle["largest_gaps"][1]["after"] == "triton_tem_fused_addmm_1"  # ends last before the gap


def test_kernel_table_shares():
    top, totals = kernel_table(device_events(KERNELS), steps=2)
    total = 10 + 20 + 20 + 50 + 5 + 15
    assert totals["kernels_per_step"] == 3.0
    assert totals["kernel_ms_per_step"] == pytest.approx(total / 2 / 1e3)
    by = totals["by_kind"]
    assert by["triton"]["share"] == pytest.approx(30 / total)
    assert by["matmul"]["share"] == pytest.approx(40 / total)
    assert by["communication"]["share"] == pytest.approx(50 / total)
    assert by["memcpy"]["share"] == pytest.approx(5 / total)
    assert top[0]["name"].startswith("ncclDevKernel") and top[0]["avg_us"] == 50
    excl = {row["name"][:8]: row["excl_us_per_step"] for row in top}
    # the addmm overlaps the matmul from 40 to 50 us: that time is the matmul's, the addmm keeps 50-60
    assert excl == {"triton_p": 5, "nvjet_ts": 10, "triton_t": 5, "ncclDevK": 25, "Memcpy D": 2.5, "void at:": 7.5}
    assert sum(excl.values()) * 2 == 110  # the GPU's busy time over the two steps
    early = {row["name"][:8]: row["early_us_median"] for row in top}
    # only the addmm started (at 40 us) before the kernels before it had ended (the matmul, at 50 us)
    assert early == {"triton_p": 0, "nvjet_ts": 0, "triton_t": 10, "ncclDevK": 0, "Memcpy D": 0, "void at:": 0}


def test_cpu_self_times_subtract_nested_ops():
    ops = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 10, "dur": 60, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 20, "dur": 5, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "ts": 200, "dur": 40, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "ts": 0, "dur": 30, "pid": 1, "tid": 2},  # other thread
    ]
    out = cpu_self_times(ops, steps=1)
    self_ms = {r["name"]: r["self_ms_per_step"] for r in out["top"]}
    assert self_ms == pytest.approx({"aten::linear": 0.040, "aten::addmm": 0.055, "aten::empty": 0.005,
                                     "aten::relu": 0.070})
    assert out["cpu_self_ms_per_step"] == pytest.approx(0.170)
    assert out["by_kind"]["matmul"]["share"] == pytest.approx(0.095 / 0.170)


def test_exposed_communication_is_collective_time_with_no_other_kernel_running():
    # The all-reduce of KERNELS runs alone (the memcpy starts as it ends): all of it is exposed.
    alone = exposed_communication(device_events(KERNELS), steps=2)
    assert alone == {"comm_ms_per_step": 0.025, "exposed_ms_per_step": 0.025, "exposed_frac": 1.0}
    # FSDP2-like: a reduce-scatter [100, 150] and an all-gather [140, 170] on their own streams, compute
    # kernels [120, 130] and [145, 160] beside them: the collectives' union is 70 us, 25 of it hidden.
    overlapped = device_events([
        k("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 100, 50, stream=3),
        k("ncclDevKernel_AllGather_RING_LL", 140, 30, stream=4),
        k("nvjet_tst_128x64_64x4_1x2_h_bz_NNT", 120, 10),
        k("triton_poi_fused_gelu_0", 145, 15),
    ])
    figures = exposed_communication(overlapped, steps=1)
    assert figures["comm_ms_per_step"] == pytest.approx(0.070)
    assert figures["exposed_ms_per_step"] == pytest.approx(0.045)
    assert figures["exposed_frac"] == pytest.approx(45 / 70)
    assert exposed_communication(device_events(KERNELS[:1]), steps=1)["exposed_frac"] == 0.0  # no collectives


def test_summarise_gzipped_trace(tmp_path):
    path = tmp_path / "t.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": KERNELS + [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9,
                                              "pid": 1, "tid": 1}]}, f)
    assert len(load_trace(path)) == 7
    gpu = summarise_trace(path, 2, "cuda")
    assert gpu["gpu"]["status"] == "ok" and gpu["gpu"]["idle"]["gaps"] == 3
    assert gpu["gpu"]["communication"]["exposed_ms_per_step"] == pytest.approx(0.025)
    cpu = summarise_trace(path, 2, "cpu")
    assert cpu["gpu"]["status"] == "n/a" and "CPU run" in cpu["gpu"]["reason"]
    assert cpu["cpu"]["top"][0]["name"] == "aten::mm"


def test_timeline_tables_show_which_kernels_started_early():
    summary = {"gpu": gpu_timeline(KERNELS, steps=2), "cpu": cpu_self_times([], steps=2)}
    lines = timeline_tables(summary, "step", "")
    header = next(line for line in lines if line.startswith("| kernel |"))
    assert header.endswith("| exclusive us/step | started early, median us |")
    addmm = next(line for line in lines if line.startswith("| `triton_tem_fused_addmm_1`"))
    assert addmm.endswith("| 5.0 | 10.0 |")  # 5 us/step its own (10 over 2 steps), started 10 us early
    for row in summary["gpu"]["top_kernels"]:  # a summary written before the column existed
        del row["early_us_median"]
    assert next(line for line in timeline_tables(summary, "step", "")
                if line.startswith("| `triton_tem_fused_addmm_1`")).endswith("| 5.0 | - |")
