"""The LLM options `kiln generate` and `kiln bench llm` share (model, device, dtype, quantization,
decode kernels, compile scope), each defined once as an option field (kiln.config.options); their checks are in
kiln.generate.llm_checks. Imports no torch: the CLI builds its parsers from these."""

from __future__ import annotations

from typing import Any, get_args

from kiln.config.options import option
from kiln.config.schema import CompileScope

MODEL_HELP = ("a preset: llama-tiny | llama-3.2-1b | llama-3.2-3b | llama-3.1-8b (shapes only, random weights), a "
              "config.json, or a local HF model directory (config.json + *.safetensors [+ tokenizer.json]); the "
              "names of `kiln train model.name=hf:NAME` work as they are (hf:llama-tiny, hf:path/to/dir)")
QUANT_HELP = ("weight-only quantization: none, int8 (per-channel), int4 (groups of --group-size, CUDA + bf16 "
              "through torchao), nf4 (bitsandbytes)")


def model_option(*, required: bool) -> Any:
    return option(None, help=MODEL_HELP, required=required)


def device_option(**flag: Any) -> Any:
    return option("auto", help="auto (CUDA if present), cpu, cuda, cuda:N", **flag)


def dtype_option(**flag: Any) -> Any:
    return option("auto", help="auto (bf16 on CUDA, fp32 on CPU), bf16, fp16, fp32", **flag)


def quants_option() -> Any:
    """--quant as a comma list, one kiln row each (kiln bench llm)."""
    return option(default_factory=list, name="--quant", shape="comma_each",
                  help=f"comma-separated, one kiln row each; {QUANT_HELP} (default none)")


def quant_option() -> Any:
    """--quant as one kind (kiln generate)."""
    return option("none", help=f"{QUANT_HELP} (default none)")


def group_size_option() -> Any:
    return option(None, help="input features per scale: int4 32/64/128/256 (default 128), int8 per-channel unless "
                  "given, nf4 block size (default 64); must divide the model's dims")


def quant_backend_option() -> Any:
    return option("torchao", help="int8/int4 through torchao (default; pip install 'kiln[quant]'), torch (kiln's "
                  "layers on torch's ops: tinygemm for int4), inductor (int4 dequantized inside inductor's fused "
                  "decode kernels), triton (int4 read by kiln's Triton kernel; CUDA), gemlite (int4 through gemlite's "
                  "Triton kernels; CUDA, pip install 'kiln[gemlite]'), or auto (torchao where it can, "
                  "else torch); a --quant entry KIND@BACKEND overrides it for that entry")


def quant_lm_head_option() -> Any:
    return option(True, shape="on_off", help="quantize the output head too (default on)")


def decode_attention_option() -> Any:
    return option("auto", help="decode-step attention: auto (default: triton where it runs, else matmul), matmul (two "
                  "broadcast matmuls inductor fuses), flash (CUDA, fp16/bf16: FlashAttention-2's varlen kernel over "
                  "the static cache) or triton (CUDA, fp16/bf16: kiln's split-KV Triton kernel)")


def decode_matvec_option() -> Any:
    return option("auto", help="decode-step projections: auto (default: triton where it runs, else inductor), inductor "
                  "(torch.compile's fused reductions) or triton (CUDA, fp16/bf16: kiln's matrix-vector kernel with the "
                  "norms and residual adds fused in)")


def compile_scope_option() -> Any:
    return option("blocks", choices=get_args(CompileScope),
                  help="what is compiled: blocks (default: each repeated block once for every layer and shape, the "
                  "shortest warm-up) or step (the whole step per shape and sampling mode: more fusion, a few "
                  "percent faster decode, a far longer warm-up)")
