"""kiln.compile_cache.cache_use: the Triton kernels a block compiles or loads from Triton's on-disk
cache are counted (a real compile for sm_90 on this CPU), an earlier compile listener still hears
each one, and `reason` says it in words."""

from __future__ import annotations

import pytest

from kiln.compile_cache import CacheUse, cache_use, reason


def test_reason_words_graphs_and_kernels():
    assert reason({}) == ""
    assert reason(CacheUse(graphs_compiled=1).counts()) == "1 graph compiled"
    assert reason(CacheUse(graphs_from_cache=2, graphs_compiled=1).counts()) == \
        "1 graph compiled, 2 graphs from the compile cache"
    assert reason(CacheUse(graphs_from_cache=1, kernels_from_cache=30).counts()) == \
        "1 graph from the compile cache; 30 Triton kernels from Triton's cache"
    assert reason(CacheUse(kernels_compiled=14, kernel_compile_s=9.84, kernels_from_cache=1).counts()) == \
        "14 Triton kernels compiled in 9.8 s, 1 from Triton's cache"
    assert reason(CacheUse(kernels_compiled=1, kernel_compile_s=0.25).counts()) == "1 Triton kernel compiled in 0.2 s"
    assert CacheUse(kernel_compile_s=1.2346).counts()["kernel_compile_ms"] == 1235
    assert reason(CacheUse(graphs_compiled=1, trace_s=2.14, inductor_s=9.04).counts()) == \
        "1 graph compiled (traced in 2.1 s, inductor 9.0 s)"
    assert reason(CacheUse(graphs_from_cache=1, inductor_s=0.9, kernels_from_cache=2).counts()) == \
        "1 graph from the compile cache (inductor 0.9 s); 2 Triton kernels from Triton's cache"
    assert reason(CacheUse(graphs_from_cache=1, trace_s=0.107, inductor_s=0.034).counts()) == \
        "1 graph from the compile cache (traced in 0.1 s)"


def _compile_add(scale: int):
    """A two-line kernel compiled for sm_90 (Triton's NVIDIA passes and ptxas run on the CPU)."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def add(X, Y, SCALE: tl.constexpr):
        i = tl.arange(0, 16)
        tl.store(Y + i, tl.load(X + i) * SCALE)

    src = ASTSource(add, {"X": "*fp32", "Y": "*fp32", "SCALE": "constexpr"}, {(2,): scale})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})


def test_counts_compiled_and_cached_kernels_and_keeps_the_earlier_listener(tmp_path, monkeypatch):
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton has no NVIDIA backend here")
    from triton import knobs

    monkeypatch.setattr(knobs.cache, "dir", str(tmp_path / "triton"))
    heard = []

    def earlier(*, src, metadata, metadata_group, times, cache_hit):
        heard.append(cache_hit)

    monkeypatch.setattr(knobs.compilation, "listener", earlier)
    with cache_use() as use:
        _compile_add(3)  # new: compiled
        _compile_add(3)  # the same source and constants: from Triton's on-disk cache
        _compile_add(5)  # another constant: compiled
    assert (use.kernels_compiled, use.kernels_from_cache) == (2, 1)
    assert use.compiled_names == ["add"]  # one kernel, two specialisations
    assert use.kernel_compile_s > 0
    assert heard == [False, True, False]
    assert knobs.compilation.listener is earlier  # put back
    _compile_add(7)
    assert use.kernels_compiled == 2 and heard[-1] is False  # nothing counted after the block
    assert (use.graphs_compiled, use.graphs_from_cache) == (0, 0)
