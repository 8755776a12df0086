"""float8 under FSDP2 (kiln.train.float8): tensorwise weights all-gathered in float8 with their
scales precomputed once per optimizer step, rowwise gathered in bf16 (torchao supports float8
all-gather for tensorwise scaling only). CPU cannot run float8 matmuls: torchao's emulated
matmuls stand in, so what is checked is the configuration and the per-step hook, on 2 gloo ranks."""

from __future__ import annotations

import pytest

pytest.importorskip("torchao.float8")

from kiln.train.float8 import float8_config  # noqa: E402


def test_the_fsdp_float8_all_gather_flag_follows_the_recipe():
    assert float8_config("tensorwise", fsdp=True).enable_fsdp_float8_all_gather
    assert not float8_config("tensorwise", fsdp=False).enable_fsdp_float8_all_gather
    assert not float8_config("rowwise", fsdp=True).enable_fsdp_float8_all_gather
    assert not float8_config("tensorwise", fsdp=True).emulate and float8_config("rowwise", fsdp=True, emulate=True).emulate


def test_tensorwise_gathers_float8_and_precomputes_scales_rowwise_does_not(run_ranks, tmp_path):
    report = run_ranks("float8_fsdp_worker.py", tmp_path / "report.json")
    tensorwise, rowwise = report["tensorwise"], report["rowwise"]
    for r in (tensorwise, rowwise):
        assert r["converted"] == 4 and r["float8_weights"] == 4 and r["head"] == "Linear"  # blocks only
        assert r["losses_finite"] and r["scales_before"] == 0
    assert tensorwise["all_gather_flags"] == [True] and tensorwise["gathered"] == 4
    assert tensorwise["installed"] and tensorwise["precompute_calls"] == [True, True]  # once per step, whole model
    assert tensorwise["scales_set"] == 4
    assert rowwise["all_gather_flags"] == [False] and rowwise["gathered"] == 0
    assert not rowwise["installed"] and rowwise["precompute_calls"] == [] and rowwise["scales_set"] == 0
