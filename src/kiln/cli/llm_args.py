"""Flags `kiln generate` and `kiln bench llm` share (model, device, dtype) and their checks.

Every check raises ConfigError naming the flag, so bad input exits 2 before a model is built.
"""

from __future__ import annotations

import argparse

from kiln.config.errors import ConfigError

MODEL_HELP = ("a preset: llama-tiny | llama-3.2-1b | llama-3.2-3b | llama-3.1-8b (shapes only, random weights), a "
              "config.json, or a local HF model directory (config.json + *.safetensors [+ tokenizer.json]); the "
              "names of `kiln train model.name=hf:NAME` work as they are (hf:llama-tiny, hf:path/to/dir)")


def add_model_flags(p: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    p.add_argument("--model", required=model_required, help=MODEL_HELP)
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), bf16, fp16, fp32")


def add_decode_attention_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--decode-attention", default="auto",
                   help="decode-step attention: auto (default: triton where it runs, else matmul), matmul (two "
                   "broadcast matmuls inductor fuses), flash (CUDA, fp16/bf16: FlashAttention-2's varlen kernel over "
                   "the static cache) or triton (CUDA, fp16/bf16: kiln's split-KV Triton kernel)")


def add_decode_matvec_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--decode-matvec", default="auto",
                   help="decode-step projections: auto (default: triton where it runs, else inductor), inductor (torch.compile's fused reductions) "
                   "or triton (CUDA, fp16/bf16: kiln's matrix-vector kernel with the norms and residual adds fused in)")


def check_decode_matvec(choice: str, device, dtype: str) -> None:
    """ConfigError('--decode-matvec', ...) for an unknown choice, or `triton` where it cannot run."""
    from kiln.llm.decode_matvec import check
    from kiln.llm.weights import TORCH_DTYPES

    check(choice, device, TORCH_DTYPES[dtype], key="--decode-matvec")


def check_decode_attention(choice: str, device, dtype: str, head_dim: int) -> None:
    """ConfigError('--decode-attention', ...) for an unknown kernel, or `flash`/`triton` where it cannot run."""
    from kiln.llm.decode_attention import check
    from kiln.llm.weights import TORCH_DTYPES

    check(choice, device, TORCH_DTYPES[dtype], head_dim, key="--decode-attention")


def at_least(flag: str, value: int | float | None, minimum: int | float) -> None:
    if value is not None and value < minimum:
        raise ConfigError(flag, f"must be >= {minimum}, got {value}")


def resolve_device_flag(spec: str):
    """torch.device for --device; ConfigError('--device', ...) for a typo or an absent GPU."""
    from kiln.bench.llm_options import device_from_flag

    return device_from_flag(spec)


def resolve_dtype_flag(spec: str, device) -> str:
    """bf16/fp16/fp32 for --dtype (auto: bf16 on CUDA, fp32 elsewhere)."""
    from kiln.bench.llm_options import dtype_from_flag

    return dtype_from_flag(spec, device)


def split_list(values: list[str] | None) -> list[str]:
    """Comma-separated values of a repeatable flag, in order, without empties."""
    return [v.strip() for chunk in values or [] for v in chunk.split(",") if v.strip()]


def int_list(text: str) -> list[int]:
    """An argparse type: comma-separated integers (`1,4,16`); anything else is argparse's usage error."""
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def parse_ids(text: str, flag: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", ",").split(",") if t]
    except ValueError:
        raise ConfigError(flag, f"expected comma-separated integer token ids, got {text!r}") from None
    if not ids:
        raise ConfigError(flag, "no token ids given")
    return ids


QUANT_HELP = ("weight-only quantization: none, int8 (per-channel), int4 (groups of --group-size, CUDA + bf16 "
              "through torchao), nf4 (bitsandbytes)")


def add_quant_flags(p: argparse.ArgumentParser, *, many: bool) -> None:
    """--quant (one kind, or a comma list with `many`), --group-size, --quant-backend, --quant-lm-head."""
    if many:
        p.add_argument("--quant", action="append", help=f"comma-separated, one kiln row each; {QUANT_HELP} "
                       "(default none)")
    else:
        p.add_argument("--quant", default="none", help=f"{QUANT_HELP} (default none)")
    p.add_argument("--group-size", type=int, help="input features per scale: int4 32/64/128/256 (default 128), int8 "
                   "per-channel unless given, nf4 block size (default 64); must divide the model's dims")
    p.add_argument("--quant-backend", default="torchao", help="int8/int4 through torchao (default; pip install "
                   "'kiln[quant]'), torch (kiln's layers on torch's ops: tinygemm for int4), inductor (int4 dequantized "
                   "inside inductor's fused decode kernels), triton (int4 read by kiln's Triton kernel; CUDA), or auto (torchao where it can, else torch); a --quant entry "
                   "KIND@BACKEND overrides it for that entry")
    p.add_argument("--quant-lm-head", choices=("on", "off"), default="on",
                   help="quantize the output head too (default on)")


def resolve_quant_flags(entries: list[str], args: argparse.Namespace, config, device, dtype: str) -> dict:
    """entry (`KIND` or `KIND@BACKEND`) -> checked QuantSpec; ConfigError naming the flag otherwise."""
    from kiln.bench.llm_options import quant_specs
    from kiln.llm.quant import QuantSpec

    defaults = QuantSpec(group_size=args.group_size, backend=args.quant_backend, lm_head=args.quant_lm_head == "on")
    return quant_specs(entries, defaults, config, device, dtype)
