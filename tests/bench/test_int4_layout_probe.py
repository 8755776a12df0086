"""benchmarks/int4_layout_probe.py on CPU: its adjacent packing is kiln's, the blocked one puts
input j*R + r of a group in nibble j of word r, and the probe kernel's product (either layout,
splits, a partial output block, rows past the tile) equals the dequantized weight's, under
Triton's interpreter (fp32, and fp16's MAGIC path)."""

from __future__ import annotations

import pytest
import torch

from ..benchmark_scripts import load_script
from ..kernels.triton_interpreter import interpreted, not_in_subprocess, rerun_interpreted

pytest.importorskip("triton", reason="Triton is not installed (pip install 'kiln[test]')")
probe = load_script("int4_layout_probe")


@not_in_subprocess
def test_under_interpreter():
    rerun_interpreted(__file__)


def test_adjacent_packing_is_kilns_and_blocked_moves_inputs_r_apart():
    from kiln.llm.int4_layout import pack_words

    q = torch.randint(0, 16, (3, 256), generator=torch.Generator().manual_seed(0))
    assert torch.equal(probe.pack(q, blocked=False), pack_words(q))
    words = probe.pack(q, blocked=True)  # [K/8, N]
    for g, r, j in [(0, 0, 1), (0, 5, 7), (1, 15, 3), (1, 2, 0)]:
        nibble = (words[g * 16 + r, 2].item() >> (4 * j)) & 15
        assert nibble == q[2, g * 128 + j * 16 + r].item()
    assert not torch.equal(words, pack_words(q))


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("rows,setting", [(3, (16, 3, 4, 2, 16)), (17, (32, 1, 4, 2, 16))])
def test_probe_product_matches_the_dequantized_weight(dtype, blocked, rows, setting):
    layer = probe.quantized(40, 512, torch.device("cpu"), dtype, seed=rows)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = probe.probe_rows(x, probe.pack(layer["q"], blocked), layer["scale"], layer["offset"], blocked, setting)
    expected = x.float() @ layer["w"].t()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.float(), expected, rtol=tol, atol=tol * float(expected.abs().max()))
    wrong = probe.probe_rows(x, probe.pack(layer["q"], not blocked), layer["scale"], layer["offset"], blocked, setting)
    assert (wrong.float() - expected).abs().max() > 10 * tol * float(expected.abs().max())
