"""The read-only streaming kernel reads every word of the buffer (Triton's interpreter, on CPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

SCRIPT = """
import functools, operator, torch
from kiln.kernels.stream_read import triton_read
buf = torch.randint(0, 255, (8 * 16384 * 2 + 64,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
want = functools.reduce(operator.xor, buf.view(torch.int64).tolist())
for block, warps in ((4096, 8), (16384, 16)):
    out = triton_read(buf, block, warps)()
    assert out.numel() == -(-buf.numel() // 8 // block), out.numel()
    assert functools.reduce(operator.xor, out.tolist()) == want, block
print("ok")
"""


def test_every_word_is_read_once():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
