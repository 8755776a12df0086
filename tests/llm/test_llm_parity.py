"""kiln.llm.parity: the check the GPU script runs on the 3B shape, here on a tiny checkpoint."""

from __future__ import annotations

import torch

from kiln.llm import resolve_model
from kiln.llm.parity import compare_with_hf


def test_compare_with_hf_passes_on_identical_weights(checkpoints):
    tf32 = torch.backends.cuda.matmul.allow_tf32
    result = compare_with_hf(resolve_model(str(checkpoints["llama3-tied"])), device="cpu", positions=24,
                             greedy_steps=12)
    assert result["ok"], result["checks"]
    assert result["kiln_fp32_vs_hf_fp32"]["max_abs"] < 1e-4
    assert result["greedy_identical_steps"] == 12 and result["greedy_kiln"] == result["greedy_hf"]
    assert result["kiln_bfloat16_vs_hf_fp32"]["max_abs"] > 0  # the bf16 side really ran in bf16
    assert torch.backends.cuda.matmul.allow_tf32 == tf32  # restored
