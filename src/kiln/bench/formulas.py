"""The arithmetic behind every figure the benchmarks report, in one place, each pinned by an exact test.

Rates are per second; fractions are plain ratios (0.5 = half). A function returns None where a
figure cannot be formed (a zero or missing denominator) instead of raising or dividing by zero.
"""

from __future__ import annotations

from typing import Any


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None when either is missing or den is not positive."""
    if num is None or den is None or den <= 0:
        return None
    return num / den


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m x k) @ (k x n) matmul: one multiply and one add per term."""
    return 2 * m * n * k


def tflops(flops: float | None, seconds: float | None) -> float | None:
    """TFLOP/s of `flops` done in `seconds`."""
    rate = ratio(flops, seconds)
    return rate / 1e12 if rate is not None else None


def peak_fraction(flops: float | None, seconds: float | None, peak_flops_per_s: float | None) -> float | None:
    """Achieved FLOP/s over a peak (MFU when `flops` are the model's FLOPs and the peak is the device's)."""
    return ratio(ratio(flops, seconds), peak_flops_per_s)


def within_relative(value: float, reference: float, tol: float) -> bool:
    """`value` differs from `reference` by at most `tol` of the reference's magnitude (a final loss
    against its reference row's)."""
    return abs(value - reference) <= tol * abs(reference)


def int4_weight_bytes(out_f: int, in_f: int, group: int = 128, scale_bytes: int = 2) -> int:
    """Bytes of an [out_f, in_f] weight in kiln's int4 layout (int4@triton): half a byte a weight, and a
    scale and an offset (`scale_bytes` each, the model dtype) per `group` inputs and output."""
    return out_f * in_f // 2 + 2 * (in_f // group) * out_f * scale_bytes


def decode_steps(new_tokens: int) -> int:
    """Decode steps in a request of `new_tokens`: the first new token comes from the prefill."""
    return max(0, new_tokens - 1)


def decode_tok_s(batch: int, new_tokens: int, decode_s: float | None) -> float | None:
    """Tokens/s of the decode phase: batch x decode steps over the time from the first new token
    to the last."""
    steps = decode_steps(new_tokens)
    return ratio(batch * steps, decode_s) if steps else None


def request_tok_s(batch: int, new_tokens: int, request_s: float | None) -> float | None:
    """New tokens/s over the whole request (prefill included), the way gpt-fast counts."""
    return ratio(batch * new_tokens, request_s)


def prefill_tok_s(batch: int, prompt_len: int, prefill_s: float | None) -> float | None:
    return ratio(batch * prompt_len, prefill_s)


def decode_bytes_per_s(step_bytes: int, tok_s: float | None, batch: int) -> float | None:
    """Bytes/s a decode reads: `step_bytes` (every weight once, and the KV cache) per step, and a
    step makes `batch` tokens."""
    steps_per_s = ratio(tok_s, batch)
    return step_bytes * steps_per_s if steps_per_s is not None else None


def roofline_tok_s(bytes_per_s: float | None, step_bytes: int, batch: int) -> float | None:
    """The decode tokens/s a bandwidth allows when each step reads `step_bytes` (the weights, and
    the KV cache it attends over: `kv_bytes_per_step`) and makes `batch` tokens."""
    steps = ratio(bytes_per_s, step_bytes)
    return steps * batch if steps is not None else None


def kv_bytes_per_step(*, batch: int, prompt_len: int, new_tokens: int, n_layers: int, kv_heads: int, head_dim: int,
                      dtype_bytes: int, windows: tuple[int | None, ...] = ()) -> int:
    """KV-cache bytes a decode step reads, averaged over a request's decode steps: step i (1 .. n-1)
    attends the prompt and i new tokens (the step's own included), keys and values of every layer,
    at most its window (`windows`, per layer; empty: none). Exact integer mean (floor)."""
    return attended_kv_bytes(lengths=[prompt_len] * batch, first_step=1, last_step=decode_steps(new_tokens),
                             n_layers=n_layers, kv_heads=kv_heads, head_dim=head_dim, dtype_bytes=dtype_bytes,
                             windows=windows)


def attended_kv_bytes(*, lengths: list[int], first_step: int, last_step: int, n_layers: int, kv_heads: int,
                      head_dim: int, dtype_bytes: int, windows: tuple[int | None, ...] = ()) -> int:
    """KV-cache bytes a decode step reads, averaged over decode steps `first_step` .. `last_step`:
    at step i a row with a prompt of lengths[b] tokens attends lengths[b] + i slots, keys and values
    of every layer, at most its window. Exact integer mean (floor); 0 for no step."""
    steps = last_step - first_step + 1
    if steps <= 0:
        return 0
    per_slot = 2 * kv_heads * head_dim * dtype_bytes
    total = 0
    for layer in range(n_layers):
        window = windows[layer] if windows else None
        for n in lengths:
            total += sum(min(n + i, window) if window else n + i for i in range(first_step, last_step + 1))
    return total * per_slot // steps


def speedup(base_s: float | None, mine_s: float | None) -> float | None:
    """How many times faster `mine` is than `base` (base time over mine)."""
    return ratio(base_s, mine_s)


def flops_params(hf: dict[str, Any]) -> int:
    """The parameters counted in 6 x N: the model's, with the LM head and without the embedding
    table (a lookup multiplies nothing), so the tied and the untied shape count the same and a tied
    Llama counts its published parameter count (Llama-3.2-1B: 1,235,814,400)."""
    h, layers, inter, vocab = (int(hf[k]) for k in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                                     "vocab_size"))
    heads = int(hf["num_attention_heads"])
    kv = int(hf.get("num_key_value_heads") or heads)
    d = int(hf.get("head_dim") or h // heads)
    attention = h * heads * d + 2 * h * kv * d + heads * d * h
    mlp = 3 * h * inter
    norms = 2 * h
    return layers * (attention + mlp + norms) + h + vocab * h


def flops_per_token(hf: dict[str, Any], seq_len: int) -> int:
    """6 x flops_params + 12 x layers x hidden x seq_len (forward and backward)."""
    return 6 * flops_params(hf) + 12 * int(hf["num_hidden_layers"]) * int(hf["hidden_size"]) * seq_len


def causal_attention_flops(*, batch: int, heads: int, seq_len: int, head_dim: int, backward: bool) -> int:
    """Matmul FLOPs of causal self-attention over `seq_len` tokens, the masked half not counted:
    forward QK^T and PV, 2 x 2 x B x H x S^2 x D / 2; backward five such products where forward has
    two (dV, dP, dS->dQ, dS->dK and the recomputed QK^T), so forward + backward is seven halves of forward."""
    forward = 2 * batch * heads * seq_len * seq_len * head_dim
    return forward * 7 // 2 if backward else forward
