"""The figures of `kiln bench train-llm`: model FLOPs per token (exact), step statistics, MFU, and
the comparison with the reference row."""

from __future__ import annotations

import pytest

from kiln.bench import formulas
from kiln.bench.train_llm import llm_train_bench as tb
from kiln.bench.train_llm.llm_train_result import TrainRow, compare
from kiln.llm.presets import PRESETS


def test_flops_per_token_is_six_params_with_lm_head_plus_attention_term():
    hf = PRESETS["llama-3.2-1b"]
    # Llama-3.2-1B has 1,235,814,400 parameters with tied embeddings: with the LM head counted and the
    # embedding table not, exactly those (the table is the LM head).
    assert formulas.flops_params(hf) == 1_235_814_400
    assert formulas.flops_per_token(hf, 2048) == 6 * 1_235_814_400 + 12 * 16 * 2048 * 2048
    # Untying adds parameters (a separate embedding table) but no multiplications.
    assert formulas.flops_params({**hf, "tie_word_embeddings": False}) == 1_235_814_400
    hf3 = PRESETS["llama-3.2-3b"]
    assert formulas.flops_params(hf3) == 3_212_749_824
    assert formulas.flops_per_token(hf3, 8192) == 6 * 3_212_749_824 + 12 * 28 * 3072 * 8192


def test_flops_params_counts_each_projection_norm_and_the_head():
    hf = {"hidden_size": 8, "num_hidden_layers": 2, "intermediate_size": 16, "vocab_size": 10,
          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4}
    per_layer = 8 * 8 + 2 * 8 * 4 + 8 * 8 + 3 * 8 * 16 + 2 * 8  # q, k and v, o, gate/up/down, two norms
    assert formulas.flops_params(hf) == 2 * per_layer + 8 + 10 * 8  # final norm, LM head


def test_figures_take_the_median_after_warmup_and_both_mfus():
    # step_s[k] is step k + 2; warmup 3 drops steps 1 (timed apart), 2 and 3.
    step_s = [9.0, 8.0, 0.2, 0.1, 0.3, 0.1, 0.1]
    row = tb.figures(step_s, warmup=3, tokens_per_step=1000, fpt=10, spec=1e6, matmul=5e5)
    assert row["timed_steps"] == 5
    assert row["step_ms"] == pytest.approx(100.0)
    assert row["tokens_per_s"] == pytest.approx(10_000)
    assert row["tflops"] == pytest.approx(1e5 / 1e12)
    assert row["mfu_spec"] == pytest.approx(0.1) and row["mfu_matmul"] == pytest.approx(0.2)
    none = tb.figures([0.5, 0.5, 0.5], warmup=1, tokens_per_step=10, fpt=1, spec=None, matmul=None)
    assert none["mfu_spec"] is None and none["mfu_matmul"] is None


def _row(name, kind, tps, loss, status="ok"):
    return TrainRow(name, kind, status=status, tokens_per_s=tps, loss_last=loss)


def test_the_loss_check_compares_the_mean_of_the_last_steps():
    """One step's loss is one batch's: rows whose last losses differ by 4 % but whose last
    LOSS_TAIL steps agree within the tolerance pass; a row whose tail is off fails even when its
    last step happens to agree."""
    from kiln.bench.train_llm.llm_train_result import LOSS_TAIL, tail_mean

    base = [3.0 + 0.01 * (i % 3) for i in range(20)]
    plain = TrainRow("plain", "plain", tokens_per_s=100.0, losses=[*base[:-1], 3.0], loss_last=3.0)
    noisy = TrainRow("noisy", "kiln", tokens_per_s=110.0, losses=[*base[:-1], 3.12], loss_last=3.12)
    drifted = [v * 1.05 for v in base[:-1]] + [3.0]
    off = TrainRow("off", "kiln", tokens_per_s=90.0, losses=drifted, loss_last=3.0)
    compare([noisy, plain, off], None, tol=0.02)
    assert noisy.loss_tail == pytest.approx(sum(noisy.losses[-LOSS_TAIL:]) / LOSS_TAIL)
    assert noisy.loss_diff_vs_ref == pytest.approx(0.12)  # 4 % at the last step
    assert noisy.loss_check == "ok" and noisy.loss_tail_diff_vs_ref == pytest.approx(0.012)
    assert off.loss_diff_vs_ref == pytest.approx(0.0) and off.loss_check == "off"
    assert tail_mean([2.0, 4.0]) == 3.0  # fewer steps than LOSS_TAIL: all of them


def test_compare_against_plain_then_a_named_baseline_then_the_first():
    rows = [_row("kiln", "kiln", 150.0, 3.02), _row("plain", "plain", 100.0, 3.0),
            _row("tt", "torchtitan", 120.0, 3.2), _row("bad", "kiln", None, None, "error")]
    compare(rows, None, tol=0.02)
    assert rows[0].speedup_vs_ref == pytest.approx(1.5) and rows[0].ref == "plain"
    assert rows[0].loss_diff_vs_ref == pytest.approx(0.02) and rows[0].loss_check == "ok"
    assert rows[2].loss_check == "off"  # 0.2 > 2 % of 3.0
    assert "speedup_vs_ref" not in rows[3].to_json()
    named = [_row("a", "kiln", 100.0, 2.0), _row("b", "kiln", 130.0, 2.0)]
    compare(named, "b", tol=0.02)
    assert named[0].speedup_vs_ref == pytest.approx(100 / 130)
    first = [_row("a", "kiln", 100.0, 2.0), _row("b", "kiln", 130.0, 2.0)]
    compare(first, None, tol=0.02)
    assert first[1].speedup_vs_ref == pytest.approx(1.3)


def test_base_overrides_load_as_a_kiln_config(tmp_path):
    from kiln.config import load_config

    opts = tb.TrainLlmOptions(model="llama-3.2-1b", hf=PRESETS["llama-3.2-1b"], seq_len=64, batch=2, steps=40,
                              warmup=1, rows=[])
    cfg = load_config(None, tb.base_overrides(opts, "llama:llama-3.2-1b", tmp_path / "t.bin", "cpu"))
    assert cfg.optim.betas == [0.9, 0.95] and cfg.optim.schedule == "constant"
    assert cfg.optim.warmup_steps == opts.hyper.warmup_steps and cfg.training.grad_clip == 1.0
    assert cfg.data.token_dtype == "uint32" and cfg.data.seq_len == 64
