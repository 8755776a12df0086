"""kiln.llm.parity: the check the GPU script runs on the 3B shape, here on a tiny checkpoint."""

from __future__ import annotations

import torch

from kiln.llm import resolve_model
from kiln.llm.parity import compare_with_hf


def test_compare_with_hf_passes_on_identical_weights(checkpoints):
    tf32 = torch.backends.cuda.matmul.allow_tf32
    result = compare_with_hf(resolve_model(str(checkpoints["llama3-tied"])), device="cpu", positions=24,
                             greedy_steps=12)
    assert result.ok, result.checks()
    assert result.kiln_fp32.max_abs < 1e-4
    assert result.greedy_identical_steps == 12 and result.greedy_kiln == result.greedy_hf
    assert result.kiln_low.max_abs > 0  # the bf16 side really ran in bf16
    assert torch.backends.cuda.matmul.allow_tf32 == tf32  # restored
    recorded = result.to_json()  # the keys a results file has always had, in their order
    assert list(recorded) == ["positions", "reference_max_abs_logit", "kiln_fp32_vs_hf_fp32", "hf_bfloat16_vs_hf_fp32",
                              "kiln_bfloat16_vs_hf_fp32", "greedy_steps", "greedy_identical_steps", "greedy_kiln",
                              "greedy_hf", "checks", "ok"]
    assert recorded["kiln_bfloat16_vs_hf_fp32"] == {"max_abs": result.kiln_low.max_abs,
                                                    "mean_abs": result.kiln_low.mean_abs,
                                                    "top1_match": result.kiln_low.top1_match}
    assert recorded["checks"] == {"fp32_logits": True, "bfloat16_logits": True, "greedy_tokens": True}
    assert recorded["ok"] is True
