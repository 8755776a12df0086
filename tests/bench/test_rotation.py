"""Operand copies a microbenchmark cycles through so it reads memory, not the L2 cache."""

from __future__ import annotations

import pytest

from kiln.bench.rotation import DEFAULT_L2_BYTES, copies_beyond_l2, l2_bytes


def test_copies_cover_three_times_the_l2():
    mib = 2**20
    assert copies_beyond_l2(5 * mib, 50 * mib) == 30  # a 3B layer's K/V at 1280 slots (5 MiB): 150 MiB a pass
    assert copies_beyond_l2(7 * mib, 50 * mib) == 22  # rounds up: 22 x 7 = 154 >= 150
    assert copies_beyond_l2(200 * mib, 50 * mib) == 2  # an lm_head: never fewer than two
    assert copies_beyond_l2(200 * mib, 50 * mib, at_least=1) == 1
    assert copies_beyond_l2(mib, 50 * mib, factor=2) == 100
    with pytest.raises(ValueError, match="nbytes"):
        copies_beyond_l2(0)


def test_l2_size_off_cuda_is_the_h100_default():
    assert l2_bytes("cpu") == l2_bytes(None) == DEFAULT_L2_BYTES == 50 * 2**20
