"""How much a quantized model's outputs move: logit drift against the unquantized model, and
perplexity on a local text file.

Drift is measured on a fixed prompt set (`drift_prompts`: 4 prompts of 128 tokens, the start of
the perplexity text when there is one, else seeded random token ids), every position, full
vocabulary, both models eager:
- `drift_max_abs`, `drift_mean_abs`: |logits_q - logits_ref|;
- `drift_rel_err`: RMS of that difference over the RMS spread of the reference logits (scale-free);
- `drift_top1`: share of positions whose most likely token is the same;
- `drift_kl`: mean KL(ref || quant) in nats per token, the change of the next-token distribution
  (llama.cpp's KLD statistic). This is the figure bounded by `DRIFT_BOUNDS`.

Two checks mark a row. Kernel fidelity, on any weights: the quantized model against its own
dequantized weights run through plain matmuls (`fidelity_kl` <= `FIDELITY_BOUND`), on the prompts
and on decode-sized slices of them (`kernel_fidelity`), which catches a kernel, packing or layout
error on the GPU that CPU tests cannot reach. Quality, on a checkpoint's
real weights only: `drift_kl` <= `DRIFT_BOUNDS[kind]`, and, when a perplexity text is given, the
perplexity ratio quantized / unquantized <= `PPL_BOUNDS[kind]`. Random weights (kiln's presets) have no
structure for the rounding to hide in, so their drift is reported but not judged.

Why KL and these bounds: a softmax does not care about a constant shift of the logits, and on a
model with random weights the logits are nearly flat, so top-1 agreement collapses there even when
the distribution hardly moves; KL measures what sampling sees on real and random weights alike.
Published figures for Llama-class checkpoints: llama.cpp's `perplexity --kl-divergence` puts
8-bit (q8_0) at a perplexity ratio of ~1.0005 and 4-bit formats at a mean KLD of a few 1e-2
(llama.cpp PR 12557: IQ4_XS 0.043; PR 6936: Llama 3 8B q4_K_M perplexity ratio 1.028, and Llama 3
loses more to quantization than Llama 2); plain round-to-nearest groups, as here, sit above the
K-quants; the 4-bit bound leaves room for that. Random weights amplify rounding layer after
layer (the 3B preset's per-layer gain is above 1), so int4 on a random model moves the logits far
more than on real weights while int8 hardly does (the cpu results README has the figures): hence
quality is judged on real weights only.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

DRIFT_BOUNDS = {"int8": 0.02, "int4": 0.25, "nf4": 0.25}
"""Largest acceptable mean KL(unquantized || quantized), nats per token, per quant kind."""
PPL_BOUNDS = {"int8": 1.01, "int4": 1.05, "nf4": 1.05}
"""Largest acceptable perplexity ratio quantized / unquantized on the perplexity text, per quant
kind, judged (like the drift bound) on a checkpoint's real weights only."""
FIDELITY_BOUND = 0.01
"""Largest acceptable mean KL between a quantized model and the same dequantized weights run through
plain matmuls (kiln.llm.quant.dequantized_reference): rounding order only, ~1e-4 in bf16."""
DRIFT_PROMPTS, DRIFT_LEN, DRIFT_SEED = 4, 128, 1234


def drift_prompts(vocab_size: int, max_positions: int, text_tokens: list[int] | None = None) -> Tensor:
    """[DRIFT_PROMPTS, length] token ids: consecutive slices of `text_tokens` when it is long enough,
    else seeded random ids (the same for every run and model of this vocabulary)."""
    length = min(DRIFT_LEN, max_positions)
    if text_tokens is not None and len(text_tokens) >= DRIFT_PROMPTS * length:
        return torch.tensor(text_tokens[: DRIFT_PROMPTS * length]).view(DRIFT_PROMPTS, length)
    gen = torch.Generator().manual_seed(DRIFT_SEED)
    return torch.randint(0, vocab_size, (DRIFT_PROMPTS, length), generator=gen)


@torch.inference_mode()
def logit_drift(model, reference, prompts: Tensor) -> dict[str, float]:
    """Drift of `model`'s logits from `reference`'s on `prompts` (one prompt at a time, so only one
    [length, vocab] pair of fp32 logits is alive)."""
    device = reference.embed.weight.device
    sums = {"abs": 0.0, "sq": 0.0, "ref_sq": 0.0, "kl": 0.0, "top1": 0.0}
    max_abs, count, positions = 0.0, 0, 0
    for row in prompts:
        tokens = row.view(1, -1).to(device)
        ref = reference(tokens)[0].float()
        got = model(tokens)[0].float()
        diff = got - ref
        max_abs = max(max_abs, float(diff.abs().max()))
        sums["abs"] += float(diff.abs().sum())
        sums["sq"] += float(diff.pow(2).sum())
        sums["ref_sq"] += float((ref - ref.mean(-1, keepdim=True)).pow(2).sum())
        log_p, log_q = ref.log_softmax(-1), got.log_softmax(-1)
        sums["kl"] += float((log_p.exp() * (log_p - log_q)).sum())
        sums["top1"] += float((ref.argmax(-1) == got.argmax(-1)).sum())
        count += diff.numel()
        positions += diff.shape[0]
    return {
        "drift_max_abs": max_abs,
        "drift_mean_abs": sums["abs"] / count,
        "drift_rel_err": math.sqrt(sums["sq"] / max(sums["ref_sq"], 1e-30)),
        "drift_top1": sums["top1"] / positions,
        "drift_kl": max(sums["kl"] / positions, 0.0),
        "drift_positions": positions,
    }


def kernel_fidelity(model, reference, prompts: Tensor, decode_rows: int) -> dict[str, float]:
    """The quantized model against its dequantized reference twice: on the full prompts (prefill
    shapes, where int4 layers may dequantize and call a plain matmul, identical to the reference)
    and on their first `decode_rows` tokens, few enough rows per call for the decode kernels
    (kiln.kernels.triton_matvec.MAX_ROWS) to run. `fidelity_kl` / `fidelity_max_abs`: the worse of the
    two, the figures judged against FIDELITY_BOUND."""
    full = logit_drift(model, reference, prompts)
    short = logit_drift(model, reference, prompts[:, :decode_rows])
    return {"fidelity_kl": max(full["drift_kl"], short["drift_kl"]),
            "fidelity_max_abs": max(full["drift_max_abs"], short["drift_max_abs"]),
            "fidelity_prompt_kl": full["drift_kl"], "fidelity_decode_kl": short["drift_kl"],
            "fidelity_decode_rows": short["drift_positions"] // prompts.shape[0]}


def judge_drift(kind: str, drift: dict[str, float]) -> tuple[float | None, bool]:
    """(bound, within it) for a quant kind's drift figures."""
    bound = DRIFT_BOUNDS.get(kind)
    return bound, bound is None or drift["drift_kl"] <= bound


def judge_quantized(kind: str, drift: dict[str, float], fidelity_kl: float, *, real_weights: bool) -> str | None:
    """None when a quantized model passes, else why not: its kernels must reproduce their own rounding
    (`FIDELITY_BOUND`, any weights); with a checkpoint's weights its drift must also stay within
    the kind's quality bound (random weights say nothing about a checkpoint's quality)."""
    if fidelity_kl > FIDELITY_BOUND:
        return (f"kernel fidelity KL {fidelity_kl:.3g} nats/token against the same rounding in plain matmuls is over "
                f"{FIDELITY_BOUND}: the quantized kernels compute something else")
    bound, ok = judge_drift(kind, drift)
    if real_weights and not ok:
        return f"logit drift KL {drift['drift_kl']:.3g} nats/token is over the {kind} bound {bound}"
    return None


# -- perplexity ------------------------------------------------------------------------------------

def judge_ppl(kind: str, ratio: float) -> tuple[float | None, str | None]:
    """(bound, None when within it else why not) for a quantized model's perplexity ratio."""
    bound = PPL_BOUNDS.get(kind)
    if bound is None or ratio <= bound:
        return bound, None
    return bound, f"perplexity {100 * (ratio - 1):+.2f}% against the unquantized model is over the {kind} bound " \
                  f"{100 * (bound - 1):+.0f}%"


@torch.inference_mode()
def perplexity(model, tokens: list[int], *, context: int, max_tokens: int | None = None) -> dict[str, float]:
    """exp(mean next-token negative log-likelihood) over non-overlapping windows of `context` tokens
    (each predicts its tokens 2..n from the ones before it, as `lm-eval`'s rolling windows without
    overlap), over the first `max_tokens` tokens."""
    device = model.embed.weight.device
    ids = tokens[:max_tokens] if max_tokens else tokens
    nll, predicted = 0.0, 0
    for start in range(0, len(ids) - 1, context):
        window = torch.tensor(ids[start: start + context], device=device).view(1, -1)
        if window.shape[1] < 2:
            break
        logits = model(window)[0, :-1].float()
        nll += float(torch.nn.functional.cross_entropy(logits, window[0, 1:], reduction="sum"))
        predicted += window.shape[1] - 1
    return {"ppl": math.exp(nll / predicted), "ppl_tokens": predicted}
