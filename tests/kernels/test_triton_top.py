"""kiln's top-k / top-p threshold kernel (kiln.kernels.triton_top) on CPU through Triton's interpreter,
against the sort it replaces (kiln.serve.row_sampling.kept_by_sort): ties, probabilities of 0,
top_k off / inside / past the vocabulary, top_p 0, below 1 and 1, rows split into several chunks;
and a threshold one bit pattern away from the next token, which only an exact search finds."""

from __future__ import annotations

import pytest
import torch

from kiln.serve.row_sampling import kept_by_sort

from .triton_interpreter import interpreted, not_in_subprocess, rerun_interpreted

tt = pytest.importorskip("kiln.kernels.triton_top", reason="Triton is not installed (pip install 'kiln[test]')")


@not_in_subprocess
def test_under_interpreter():
    rerun_interpreted(__file__)


def kept(probs, top_k, top_p):
    return probs.view(torch.int32) >= tt.keep_threshold(probs, torch.tensor(top_k), torch.tensor(top_p))[:, None]


def test_chunking_fills_the_programs_with_whole_tiles():
    assert tt.chunking(32, 128256) == (8192, 16)  # 512 programs of 16 tiles
    assert tt.chunking(1, 128256) == (512, 251)  # one tile each: as many programs as tiles
    assert tt.chunking(4, 100) == (512, 1)


@interpreted
def test_the_kernel_keeps_what_the_sort_keeps(monkeypatch):
    monkeypatch.setattr(tt, "TARGET_PROGRAMS", 8)  # several chunks per row at these sizes
    g = torch.Generator().manual_seed(0)
    for trial in range(12):
        vocab = int(torch.randint(2, 700, (1,), generator=g))
        logits = torch.randn(3, vocab, generator=g) * float(torch.rand(1, generator=g)) * 8
        if trial % 3 == 0:
            logits = torch.round(logits)  # ties, at the k-th token and at the top-p boundary
        if trial % 4 == 0:
            logits[:, :vocab // 2] = -200.0  # probabilities of 0
        probs = torch.softmax(logits, -1)
        top_k = torch.randint(0, vocab + 3, (3,), generator=g) * (torch.rand(3, generator=g) < 0.5)
        top_p = torch.where(torch.rand(3, generator=g) < 0.3, 1.0, torch.rand(3, generator=g))
        if trial == 5:
            top_p[0] = 0.0
        assert torch.equal(kept(probs, top_k.tolist(), top_p.tolist()), kept_by_sort(probs, top_k, top_p)), trial


@interpreted
def test_thresholds_on_a_known_row_and_one_bit_pattern_apart():
    probs = torch.softmax(torch.tensor([[3.0, 2.0, 2.0, 0.0, -1.0]]), -1)  # 0.55, 0.20, 0.20, 0.03, 0.01
    settings = [(0, 1.0, 5), (1, 1.0, 1), (2, 1.0, 3), (0, 0.5, 1), (0, 0.7, 3), (4, 0.99, 4), (0, 0.0, 1)]
    for k, p, n in settings:
        assert kept(probs, [k], [p])[0].tolist() == [True] * n + [False] * (5 - n), (k, p)
    near = torch.tensor([0.3]).nextafter(torch.tensor([0.0]))
    probs = torch.cat([torch.tensor([0.4, 0.3]), near, torch.tensor([0.299])]).view(1, -1)
    assert int(kept(probs, [2], [1.0]).sum()) == 2 and int(kept(probs, [3], [1.0]).sum()) == 3


def test_the_kernel_compiles_for_hopper_without_spilling():
    """Compiled for sm_90 on this CPU (benchmarks/kernel_resources.py), as a 3B's vocabulary is
    launched: the frontend and NVIDIA passes that the interpreter skips accept it, and no register spills."""
    from tests.benchmark_scripts import load_script

    resources = load_script("kernel_resources")
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton has no NVIDIA backend here")
    pointers = {"P": "*fp32", "TopK": "*i64", "TopP": "*fp32", "Part": "*fp32", "Lo": "*i64", "Hi": "*i64",
                "Target": "*fp32", "FromK": "*i64", "Out": "*i64"}
    scalars = {n: "i32" for n in ("V", "rows", "chunks", "chunk", "stride_p", "step")}
    consts = {"WAYS": tt.WAYS, "PASSES": tt.PASSES, "TOP": tt.TOP, "BLOCK_V": tt.BLOCK_V, "BLOCK_C": 16}
    used = resources.usage(resources.compile_sm90(tt._kernel(), {**pointers, **scalars}, consts, num_warps=4,
                                                  divisible=tuple(pointers)))
    assert 0 < used["registers"] <= 255 and used["stack_bytes"] == 0, used
