"""kiln's dense decode projections for several rows (kiln.kernels.triton_skinny) on CPU through
Triton's interpreter: the kernel against torch's math for each fused part (RMSNorm, SwiGLU before,
bias, residual after), row counts that leave the 16-row tile partly empty or fill 32 and 64-row
tiles, partial output blocks, K tails and uneven splits; a batched decode step through it; which
kernel a decode step picks (the table decides); the setting rule. The kernel tests run in a
subprocess (`test_under_interpreter`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kiln.llm import decode_matvec as dm

from .triton_interpreter import interpreted, not_in_subprocess, rerun_interpreted

ts = pytest.importorskip("kiln.kernels.triton_skinny", reason="Triton is not installed (pip install 'kiln[test]')")


@not_in_subprocess
def test_under_interpreter():
    rerun_interpreted(__file__)


def reference(x, w, bias, norm_w, eps, silu_mul, residual):
    """The fused math in fp32: RMSNorm or SwiGLU of x, x W^T + bias, + residual."""
    if norm_w is not None:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_w
    if silu_mul:
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    y = F.linear(x, w, bias)
    return y if residual is None else y + residual


@interpreted
@pytest.mark.parametrize("rows,out_f,in_f,part,bias,setting", [
    (2, 40, 96, "none", False, [16, 32, 1]),         # a partial output block; 3 K tiles, one split
    (5, 64, 256, "rmsnorm", True, [32, 64, 3]),      # 4 K tiles in 3 uneven splits (the last gets none)
    (16, 48, 80, "silu_mul", False, [32, 32, 2]),    # a K tail inside a tile; a full 16-row tile
    (17, 32, 128, "residual", True, [16, 32, 4]),    # a 32-row tile, 4 splits, a bias and a residual
    (9, 24, 192, "rmsnorm", False, [16, 32, 4]),     # the norm's sums of squares from 4 uneven splits
    (64, 32, 128, "none", False, [32, 64, 2, 4, 2]),  # a full 64-row tile; every mask off (EVEN)
])
def test_skinny_matches_the_math(rows, out_f, in_f, part, bias, setting):
    torch.manual_seed(rows + out_f)
    w = torch.randn(out_f, in_f)
    x = torch.randn(rows, 2 * in_f if part == "silu_mul" else in_f)
    b = torch.randn(out_f) if bias else None
    norm_w = torch.rand(in_f) + 0.5 if part == "rmsnorm" else None
    res = torch.randn(rows, out_f) if part == "residual" else None
    y = torch.ops.kiln.skinny(x, w, b, norm_w, 1e-5, part == "silu_mul", res, setting)
    expected = reference(x, w, b, norm_w, 1e-5, part == "silu_mul", res)
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)
    wrong = reference(x, w * 1.01, b, norm_w, 1e-5, part == "silu_mul", res)  # the comparison can fail
    assert (y - wrong).abs().max() > 1e-3
    from kiln.kernels import triton_launch  # the counters kiln's Triton kernels share

    assert all(int(c.abs().sum()) == 0 for c in triton_launch._ARRIVED.values())  # every split reset its counter


@interpreted
def test_split_partials_are_all_added():
    """With 4 splits the result is the whole product, not one split's share."""
    torch.manual_seed(1)
    w, x = torch.randn(16, 256), torch.randn(3, 256)
    split = torch.ops.kiln.skinny(x, w, None, None, 0.0, False, None, [16, 32, 4])
    torch.testing.assert_close(split, x @ w.t(), rtol=1e-4, atol=1e-4)
    assert (split - x[:, 192:] @ w[:, 192:].t()).abs().max() > 1e-2


@interpreted
def test_batched_decode_through_the_row_kernel(monkeypatch):
    """Three prompts, left-padded to different lengths: each decode step's dense projections go
    through the row kernel (made to take every shape) and equal the plain model's."""
    monkeypatch.setattr(ts, "takes", lambda rows, n, k, gpu="": True)
    calls = []
    real = torch.ops.kiln.skinny
    monkeypatch.setattr(torch.ops.kiln, "skinny", lambda *a, _r=real: calls.append(a[0].shape[0]) or _r(*a))
    from kiln.llm.config import config_from_dict
    from kiln.llm.weights import random_decoder

    from ..llm.conftest import assert_decode_matches_matmul
    from ..llm.test_llm_quant import QUANT_CONFIG

    small = {**QUANT_CONFIG, "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128}
    model = random_decoder(config_from_dict(small), device="cpu", dtype=torch.float32, seed=0)
    tokens = torch.randint(0, 96, (3, 7), generator=torch.Generator().manual_seed(5))
    assert_decode_matches_matmul(model, "matmul", tokens, torch.tensor([0, 2, 3]), prompt=4, matvec="triton",
                                 tol=1e-4)
    assert calls and set(calls) == {3}


@interpreted
def test_decode_steps_take_the_row_kernel_where_it_was_measured_faster(monkeypatch):
    """One row: the one-row kernel; several: the row kernel for a shape in TAKEN, the model's own
    matmul for one that is not; more rows than the kernel takes: the plain layer."""
    calls = []
    for name in ("matvec", "skinny"):
        real = getattr(torch.ops.kiln, name)
        monkeypatch.setattr(torch.ops.kiln, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    monkeypatch.setattr(ts, "TAKEN", frozenset({(16, 32, 64)}))
    held, other = nn.Linear(64, 32), nn.Linear(64, 48)
    for layer, rows in ((held, 1), (held, 2), (held, 16), (held, 17), (other, 4), (held, ts.MAX_ROWS + 1)):
        x = torch.randn(rows, 1, 64)
        torch.testing.assert_close(dm.fused_linear(layer, x), layer(x), rtol=1e-4, atol=1e-4)
    assert calls == ["matvec", "skinny", "skinny"]  # 17 rows: a 32-row tile the table does not hold


def test_table_and_rule():
    """The table is keyed by the row tile; the rule doubles splits until every SM has two programs,
    never past MAX_SPLIT nor below two 128-wide K tiles per split."""
    assert ts.table_setting(ts.MAX_ROWS + 1, 5120, 3072) is None
    for (tile, n, k), setting in ts.SETTINGS.items():
        assert tile in (16, 32, 64) and ts.table_setting(tile, n, k) == setting
        assert ts.takes(tile, n, k) == ((tile, n, k) in ts.TAKEN) and not ts.takes(1, n, k)
    assert ts.TAKEN <= set(ts.SETTINGS)  # every shape taken runs at a measured setting
    assert ts.default_setting(16, 5120, 3072, 132)[:3] == (64, 128, 4)  # 80 blocks x 4 >= 264
    assert ts.default_setting(16, 128256, 3072, 132)[2] == 1
    assert ts.default_setting(16, 3072, 8192, 132)[2] == 8  # 48 blocks: the most splits
    assert ts.default_setting(16, 64, 512, 132)[2] == 2  # 512 / 2 splits = 2 tiles of 128: no more


def test_gpu_tables_add_shapes_with_their_own_settings(monkeypatch):
    """A GPU's table adds its shapes (each with its own measured setting) on that GPU only; its name
    is matched as a word of the device's name, and read as a constant inside a compiled step."""
    for name, (shapes, settings) in ts.GPU_TABLES.items():
        assert shapes <= set(settings) and not shapes & ts.TAKEN
        for tile, n, k in shapes:
            assert ts.takes(tile, n, k, name) and not ts.takes(tile, n, k)
            assert ts.table_setting(tile, n, k, name) == settings[(tile, n, k)]
        for tile, n, k in ts.TAKEN:  # what every GPU takes stays taken
            assert ts.takes(tile, n, k, name)
    monkeypatch.setattr(ts, "GPU_TABLES", {"H200": (frozenset({(32, 3072, 3072)}), {(32, 3072, 3072): (8, 8, 1, 4, 1)})})
    assert ts.table_setting(17, 3072, 3072, "H200") == (8, 8, 1, 4, 1)
    assert ts.table_setting(17, 3072, 3072) == ts.SETTINGS[(32, 3072, 3072)]
    assert ts.takes(17, 3072, 3072, "H200") and not ts.takes(17, 3072, 3072)
    assert not ts.takes(33, 3072, 3072, "H200")  # a 64-row tile the GPU's table does not hold
    names = {0: "NVIDIA H200", 1: "NVIDIA H100 80GB HBM3", 2: "NVIDIA H200 NVL", 3: "NVIDIA GH200 480GB"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: names[i])
    assert [ts.gpu_table_name(i) for i in range(4)] == ["H200", "", "H200", ""]
    assert ts.device_table(torch.device("cpu")) == ""
    assert ts.device_table(torch.device("cuda", 1)) == "" and ts.device_table(torch.device("cuda", 2)) == "H200"

    def step(x):
        return x + (1 if ts.takes(32, 3072, 3072, ts.gpu_table_name(0)) else 2)

    assert torch.compile(step, fullgraph=True, backend="eager")(torch.zeros(2)).tolist() == [1.0, 1.0]


def test_more_rows_than_the_kernel_takes_are_refused():
    with pytest.raises(ValueError, match="MAX_ROWS"):
        ts.launch(torch.randn(ts.MAX_ROWS + 1, 32), torch.randn(8, 32), None, None, 0.0, False, None, [16, 32, 1])


def test_taken_shapes_are_those_faster_at_every_row_count_of_their_tile():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from skinny_table import row_tile, taken

    def row(variant, rows, shape, us):
        return {"variant": variant, "rows": rows, "shape": shape, "us_per_call": us}

    results = [row("cublas", r, [64, 32], 10.0) for r in (1, 2, 16, 32)] + [
        row("skinny", 1, [64, 32], 99.0), row("skinny", 2, [64, 32], 9.0), row("skinny", 16, [64, 32], 9.5),
        row("skinny", 32, [64, 32], 10.5), row("cublas", 4, [8, 32], 5.0), row("skinny", 4, [8, 32], 4.0),
        row("skinny", 8, [8, 32], 6.0), row("cublas", 8, [8, 32], 5.0)]
    assert [row_tile(r) for r in (2, 16, 17, 33, 64)] == [16, 16, 32, 64, 64]
    assert taken(results) == [(16, 64, 32)]  # 1 row is not a tile's; [8, 32] lost at 8 rows; 32 rows lost


def test_a_gpu_table_takes_the_fastest_swept_setting_where_it_beats_cublas_at_every_row_count(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from skinny_table import gpu_entry, gpu_table, main

    def row(variant, rows, shape, us):
        return {"variant": variant, "rows": rows, "shape": shape, "us_per_call": us}

    results = [row("cublas", r, [64, 32], 10.0) for r in (24, 32)] + [
        row("skinny 64/128/2/4/4", 24, [64, 32], 9.0), row("skinny 64/128/2/4/4", 32, [64, 32], 9.9),
        row("skinny 32/64/1/4/3", 24, [64, 32], 8.0), row("skinny 32/64/1/4/3", 32, [64, 32], 10.1),  # least sum, loses at 32
        row("skinny 16/64/1/4/3", 24, [64, 32], 1.0),  # not timed at 32 rows: not a candidate
        row("cublas", 16, [8, 32], 5.0), row("skinny 32/64/1/4/3", 16, [8, 32], 4.0),  # in TAKEN: left out
        row("cublas", 16, [16, 32], 5.0), row("skinny 32/64/1/4/3", 16, [16, 32], 5.5)]  # slower: not taken
    assert gpu_table(results, exclude={(16, 8, 32)}) == {}  # the least-sum setting lost at 32 rows
    results[5]["us_per_call"] = 9.95  # now it wins at both row counts
    table = gpu_table(results, exclude={(16, 8, 32)})
    assert table == {(32, 64, 32): (32, 64, 1, 4, 3)}
    entry = gpu_entry("H200", table)
    assert eval("{" + entry + "}") == {"H200": (frozenset({(32, 64, 32)}), {(32, 64, 32): (32, 64, 1, 4, 3)})}
    source = tmp_path / "table.py"
    source.write_text('T = {\n    # measured (H200): begin (tool)\n    "H200": (frozenset(), {}),\n'
                      '    # measured (H200): end\n}\n')
    runs = tmp_path / "runs.json"
    runs.write_text(__import__("json").dumps({"results": results}))
    assert main([str(runs), "--gpu", "H200", "--write", str(source)]) == 0
    written = {}
    exec(source.read_text(), written)
    both = {(16, 8, 32): (32, 64, 1, 4, 3), (32, 64, 32): (32, 64, 1, 4, 3)}  # main leaves out kiln's TAKEN only
    assert written["T"] == {"H200": (frozenset(both), both)}
    assert main([str(runs), "--gpu", "A100", "--write", str(source)]) == 2  # no block for that GPU
