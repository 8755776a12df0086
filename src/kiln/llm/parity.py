"""kiln's decoder against transformers' model with the same weights: logits and greedy tokens.

The rule is the one of PyTorch's dynamo benchmark harness: a low-precision result is judged by
its distance to a float32 reference, next to the distance the reference implementation's own
low-precision run has. So kiln in bf16 passes when its logits are about as close to HF-fp32 as
HF-bf16 is (within `LOW_PRECISION_SLACK` of HF's error), kiln in fp32 when it matches HF-fp32
to float32 rounding, and greedy decoding in fp32 must give the same tokens for `greedy_steps`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from kiln.llm.config import ModelSource
from kiln.llm.engine import Engine
from kiln.llm.hf_model import build_hf_model
from kiln.llm.weights import empty_decoder, load_hf_state_dict

LOW_PRECISION_SLACK = 1.5
"""kiln-bf16's max logit error may be this many times HF-bf16's (different fusions round differently)."""
FP32_TOLERANCE = 1e-3
"""kiln-fp32 vs HF-fp32: max abs logit error relative to the largest reference logit."""


@dataclass(frozen=True)
class LogitErrors:
    """Logits against the fp32 reference's: largest and mean absolute difference, share of positions
    with the same most likely token."""

    max_abs: float
    mean_abs: float
    top1_match: float

    @classmethod
    def of(cls, got: torch.Tensor, ref: torch.Tensor) -> LogitErrors:
        diff = (got.float() - ref).abs()
        return cls(float(diff.max()), float(diff.mean()), float((got.argmax(-1) == ref.argmax(-1)).float().mean()))


@dataclass(frozen=True)
class HfParity:
    """What compare_with_hf found; `to_json` is the dict a results file records (its keys name the
    low precision: `kiln_bfloat16_vs_hf_fp32`, `bfloat16_logits`)."""

    positions: int
    reference_max_abs_logit: float
    low_dtype: str
    """`bfloat16` or `float16`."""
    kiln_fp32: LogitErrors
    hf_low: LogitErrors
    kiln_low: LogitErrors
    greedy_steps: int
    greedy_identical_steps: int
    greedy_kiln: list[int]
    greedy_hf: list[int]
    fp32_ok: bool
    """kiln-fp32 within FP32_TOLERANCE of HF-fp32."""
    low_ok: bool
    """kiln's low-precision error within LOW_PRECISION_SLACK of HF's own."""

    @property
    def greedy_ok(self) -> bool:
        return self.greedy_identical_steps == self.greedy_steps

    @property
    def ok(self) -> bool:
        return self.fp32_ok and self.low_ok and self.greedy_ok

    def checks(self) -> dict[str, bool]:
        return {"fp32_logits": self.fp32_ok, f"{self.low_dtype}_logits": self.low_ok, "greedy_tokens": self.greedy_ok}

    def to_json(self) -> dict[str, Any]:
        low, errors = self.low_dtype, dataclasses.asdict
        return {
            "positions": self.positions, "reference_max_abs_logit": self.reference_max_abs_logit,
            "kiln_fp32_vs_hf_fp32": errors(self.kiln_fp32), f"hf_{low}_vs_hf_fp32": errors(self.hf_low),
            f"kiln_{low}_vs_hf_fp32": errors(self.kiln_low), "greedy_steps": self.greedy_steps,
            "greedy_identical_steps": self.greedy_identical_steps, "greedy_kiln": self.greedy_kiln,
            "greedy_hf": self.greedy_hf, "checks": self.checks(), "ok": self.ok,
        }


def compare_with_hf(source: ModelSource, *, device: torch.device | str, low_dtype: torch.dtype = torch.bfloat16,
                    positions: int = 128, greedy_steps: int = 32, seed: int = 0, compile: bool = False) -> HfParity:
    """Build HF's model (fp32, seeded random weights or the checkpoint), copy its weights into kiln,
    and compare logits on `positions` random tokens in fp32 and `low_dtype`, then greedy tokens in
    fp32 (kiln's engine, compiled if `compile`, against HF `generate`)."""
    device = torch.device(device)
    config = source.config
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config.vocab_size, (1, positions), generator=gen).to(device)
    # The fp32 reference must be fp32 all the way: no TF32 matmuls.
    saved_tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.inference_mode():
            hf = build_hf_model(source, device=device, dtype=torch.float32, seed=seed)
            ref = hf(tokens).logits.float()
            kiln = load_hf_state_dict(empty_decoder(config, device=device, dtype=torch.float32), hf.state_dict())
            fp32 = LogitErrors.of(kiln(tokens), ref)
            greedy_ref = hf.generate(tokens[:, :16], max_new_tokens=greedy_steps, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)[0, 16:].tolist()
            greedy_kiln = Engine(kiln, compile=compile).generate(tokens[:, :16].tolist(),
                                                                 max_new_tokens=greedy_steps).tokens[0]
            del kiln
            hf_low = hf.to(low_dtype)
            hf_err = LogitErrors.of(hf_low(tokens).logits, ref)
            kiln_low = load_hf_state_dict(empty_decoder(config, device=device, dtype=low_dtype), hf_low.state_dict())
            kiln_err = LogitErrors.of(kiln_low(tokens), ref)
            del hf, hf_low, kiln_low
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved_tf32
    scale = float(ref.abs().max())
    same = next((i for i, (a, b) in enumerate(zip(greedy_kiln, greedy_ref)) if a != b), len(greedy_ref))
    return HfParity(
        positions=positions, reference_max_abs_logit=scale, low_dtype=str(low_dtype).removeprefix("torch."),
        kiln_fp32=fp32, hf_low=hf_err, kiln_low=kiln_err, greedy_steps=greedy_steps, greedy_identical_steps=same,
        greedy_kiln=greedy_kiln, greedy_hf=greedy_ref, fp32_ok=fp32.max_abs <= FP32_TOLERANCE * scale,
        low_ok=kiln_err.max_abs <= LOW_PRECISION_SLACK * hf_err.max_abs + 1e-6 * scale)
