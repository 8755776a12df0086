"""Checks of the LLM options `kiln generate` and `kiln bench llm` share (kiln.generate.llm_flags).

Every check raises ConfigError naming the flag, so bad input exits 2 before a model is built.
"""

from __future__ import annotations

import torch

from kiln.errors import ConfigError
from kiln.llm import decode_attention, decode_matvec
from kiln.llm.config import ModelSource, resolve_model
from kiln.llm.quant import QuantSpec, bitsandbytes_missing, check_quant, parse_quant
from kiln.llm.weights import TORCH_DTYPES, has_weights
from kiln.runtime import resolve_device

DTYPES = ("auto", "bf16", "fp16", "fp32")


def device_from_flag(spec: str) -> torch.device:
    """torch.device for --device; a typo or an absent GPU is a ConfigError naming --device."""
    choices = ("auto", "cpu", "cuda", "cuda:N")
    try:
        torch.device(spec if spec != "auto" else "cpu")
    except RuntimeError:
        raise ConfigError("--device", f"not a device: {spec!r}", choices) from None
    try:
        return resolve_device(spec)
    except ConfigError as exc:
        raise ConfigError("--device", exc.message, exc.choices) from None


def dtype_from_flag(spec: str, device: torch.device) -> str:
    """bf16/fp16/fp32 for --dtype (auto: bf16 on CUDA, fp32 elsewhere)."""
    if spec not in DTYPES:
        raise ConfigError("--dtype", f"unknown dtype {spec!r}", DTYPES)
    if spec == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return spec


def quant_specs(entries: list[str], defaults: QuantSpec, config, device: torch.device,
                dtype: str) -> dict[str, QuantSpec]:
    """--quant entry (`KIND` or `KIND@BACKEND`, over `defaults` from --group-size, --quant-backend and
    --quant-lm-head) -> checked QuantSpec; two entries may not be one quantization."""
    if len(set(entries)) != len(entries):
        raise ConfigError("--quant", f"a quantization is listed twice: {','.join(entries)}")
    specs = {e: check_quant(parse_quant(e, defaults), config, device, TORCH_DTYPES[dtype]) for e in entries}
    seen: dict[tuple, str] = {}
    for entry, spec in specs.items():
        twin = seen.setdefault((spec.kind, spec.library), entry)
        if twin != entry:
            raise ConfigError("--quant", f"{twin!r} and {entry!r} are the same quantization")
    return specs


def checked_source(model: str | None, *, random_weights: bool, device: torch.device, dtype: str, attention: str,
                   matvec: str, purpose: str) -> ModelSource:
    """--model resolved (a directory without weights needs --random-weights) and the decode kernels
    it will run (--decode-attention, --decode-matvec) checked; `purpose` ends the no-weights message."""
    source = resolve_model(model)
    if source.directory is not None and not has_weights(source.directory) and not random_weights:
        raise ConfigError("--model", f"{source.directory} has no *.safetensors weights; pass --random-weights "
                          f"to {purpose} from random weights anyway (the output is noise)")
    decode_attention.check(attention, device, TORCH_DTYPES[dtype], source.config.head_dim, key="--decode-attention")
    decode_matvec.check(matvec, device, TORCH_DTYPES[dtype], key="--decode-matvec")
    return source


def one_quant(entry: str, *, group_size: int | None, backend: str, lm_head: bool, config, device: torch.device,
              dtype: str) -> QuantSpec:
    """--quant as one checked QuantSpec (with --group-size, --quant-backend, --quant-lm-head); nf4
    needs bitsandbytes."""
    quant = quant_specs([entry], QuantSpec(group_size=group_size, backend=backend, lm_head=lm_head), config, device,
                        dtype)[entry]
    if quant.kind == "nf4" and (missing := bitsandbytes_missing()):
        raise ConfigError("--quant", f"nf4 needs bitsandbytes: {missing}")
    return quant


def at_least(flag: str, value: int | float | None, minimum: int | float) -> None:
    if value is not None and value < minimum:
        raise ConfigError(flag, f"must be >= {minimum}, got {value}")


def parse_ids(text: str, flag: str) -> list[int]:
    """Comma- (or space-) separated token ids; ConfigError naming `flag` otherwise."""
    try:
        ids = [int(t) for t in text.replace(" ", ",").split(",") if t]
    except ValueError:
        raise ConfigError(flag, f"expected comma-separated integer token ids, got {text!r}") from None
    if not ids:
        raise ConfigError(flag, "no token ids given")
    return ids
