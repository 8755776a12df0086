"""What `kiln generate` is asked to do: one field per flag (kiln.config.options), unchecked;
kiln.generate.check_generate.check_generate checks it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from kiln.config.options import option
from kiln.config.schema import CompileScope
from kiln.generate import llm_flags as llm

PROMPT = "prompt (one of)"
Compile = Literal["auto", "on", "off"]


@dataclass
class GenerateOptions:
    """`kiln generate`'s request, one field per flag."""

    model: str | None = llm.model_option(required=True)
    device: str = llm.device_option()
    dtype: str = llm.dtype_option()
    prompt: list[str] = option(default_factory=list, shape="repeat", group=PROMPT,
                               help="prompt text (repeat for a batch)")
    prompt_file: str | None = option(None, group=PROMPT, help="file with one prompt per line (empty lines skipped)")
    tokens: list[str] = option(default_factory=list, shape="repeat", group=PROMPT,
                               help="prompt as comma-separated token ids (repeat for a batch)")
    tokenizer: str | None = option(None, help="directory or tokenizer.json to use instead of the model directory's")
    max_new_tokens: int = option(128, help="tokens to generate per prompt (default 128)")
    temperature: float = option(0.0, help="0 = greedy (default); > 0 samples")
    top_k: int = option(0, help="sample among the k most likely tokens (0 = off)")
    top_p: float = option(1.0, help="nucleus sampling mass (1 = off)")
    seed: int | None = option(None, help="seed for sampling")
    stop_tokens: str | None = option(None, help="comma-separated stop token ids (default: the model's EOS ids)")
    ignore_eos: bool = option(False, shape="switch", help="no stop tokens: always generate --max-new-tokens")
    compile: Compile = option(
        "auto", choices=get_args(Compile),
        help="compile prefill/decode and capture decode in a CUDA graph (auto: on for CUDA)")
    compile_scope: CompileScope = llm.compile_scope_option()
    max_seq_len: int | None = option(None, help="KV-cache slots (default: padded prompt + new tokens)")
    quant: str = llm.quant_option()
    group_size: int | None = llm.group_size_option()
    quant_backend: str = llm.quant_backend_option()
    quant_lm_head: bool = llm.quant_lm_head_option()
    decode_attention: str = llm.decode_attention_option()
    decode_matvec: str = llm.decode_matvec_option()
    json: str | None = option(None, help="also write prompts, tokens, text and timings to this JSON file")
    random_weights: bool = option(False, shape="switch", help="generate from random weights when the --model "
                                  "directory has none (the output is noise)")
