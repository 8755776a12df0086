"""What `kiln bench llm` is asked to do: `LlmBenchOptions`, one field per flag (kiln.config.options).

The request as the user gave it (`auto`, None and empty lists mean "the default"); from these
fields come the flags, their defaults and the command line recorded with the results, in field
order. kiln.bench.llm.llm_options.check_options checks it and returns the plan the bench runs. Imports
no torch: the CLI builds its parser from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kiln.config.options import option
from kiln.generate.llm_flags import (
    decode_attention_option,
    decode_matvec_option,
    device_option,
    dtype_option,
    group_size_option,
    model_option,
    quant_backend_option,
    quant_lm_head_option,
    quants_option,
)

Engine = Literal["hf-eager", "hf-compiled", "kiln-eager", "kiln-compiled", "kiln-blocks"]
PrefillMode = Literal["compiled", "eager"]
Tuning = Literal["full", "decode", "off"]


@dataclass
class LlmBenchOptions:
    """`kiln bench llm`'s request, one field per flag, unchecked (check_options checks it)."""

    model: str | None = model_option(required=False)
    preset: str | None = option(None, help="seed002-llama3b (its model and sizes; flags given still apply)")
    prompt_len: int | None = option(None, help="prompt tokens (default 1024)")
    new_tokens: int | None = option(None, help="tokens generated per request (default 256)")
    device: str = device_option(record="always")
    dtype: str = dtype_option(record="always")
    warmup: int = option(1, record="always", help="untimed requests per engine after the first (default 1)")
    repeats: int = option(3, record="always", help="timed requests per engine, interleaved (default 3)")
    prefill_repeats: int = option(10, record="always", help="timed prefills per engine (default 10)")
    seed: int = option(0, record="always", help="seed of the prompt and of random weights")
    group_size: int | None = group_size_option()
    quant_backend: str = quant_backend_option()
    quant_lm_head: bool = quant_lm_head_option()
    ppl_file: str | None = option(
        None, help="local text file (tokenized with the model's tokenizer.json), file of token ids, or a `kiln data "
        "prepare` directory (its val.bin): perplexity of every kiln model on it; on real weights a quantized row over "
        "the perplexity bound (int8 +1%%, int4 +5%%) is accuracy_fail")
    ppl_context: int = option(1024, help="perplexity window in tokens (default 1024)")
    ppl_tokens: int = option(16384, help="score at most this many tokens of --ppl-file (default 16384)")
    prefill: PrefillMode = option(
        "compiled", help="kiln-compiled's prefill: compiled (default) or eager (skips a whole-model compile per row)")
    tuning: Tuning = option("full", help="where kiln-compiled runs coordinate-descent tuning: full (default), decode "
                            "(not in prefill: shorter warm-up), off (also slows batch-1 decode)")
    decode_attention: str = decode_attention_option()
    decode_matvec: str = decode_matvec_option()
    deadline_s: float | None = option(None, help="start no row's warm-up after this many seconds; later rows are "
                                      "skipped (a time-boxed run still writes every row it finished)")
    profile_decode: int = option(0, metavar="N", help="after timing, profile N decode steps of each kiln row "
                                 "(torch.profiler): kernels, GPU gaps, bandwidth while busy and what bounds decode, in "
                                 "DIR/decode_profile/ (default 0: off)")
    profile_prefill: int = option(0, metavar="N", help="after timing, profile N prefills of each kiln row "
                                  "(torch.profiler): kernels, GPU gaps, host time, compute rate while busy and what "
                                  "bounds the prefill, in DIR/prefill_profile/ (default 0: off)")
    out: str | None = option(None, help="output directory (default: runs/<time>-bench-llm-<name>)")
    gpt_fast: str | None = option(None, metavar="DIR", help="a gpt-fast checkout: add its rows (bf16, and int4 "
                                  "through its own quantize.py) on the same weights, run after kiln's in subprocesses; "
                                  "its commit is recorded")
    gpt_fast_quants: list[str] = option(default_factory=lambda: ["none", "int4"], name="--gpt-fast-quant",
                                        shape="comma", help="gpt-fast rows: comma-separated none,int4 (default both; "
                                        "int4 groups of --group-size, default 128)")
    gpt_fast_timeout_s: float = option(600.0, help="seconds all gpt-fast rows together may take (default 600)")
    end_by_s: float | None = option(None, help="gpt-fast rows end by this many seconds after the bench started (with "
                                    "--deadline-s, a time-boxed run); a row out of time records why")
    engines: list[Engine] = option(default_factory=list, shape="comma_each",
                                   help="comma-separated: hf-eager,hf-compiled,kiln-eager,kiln-compiled,kiln-blocks")
    quants: list[str] = quants_option()
    batch: list[int] = option(default_factory=list, shape="comma_each",
                              help="batch sizes (prompts per request), comma-separated, e.g. 1,4,16,64: every engine "
                              "runs once per batch size, each row with its roofline for the weights and the KV cache a "
                              "step reads (default 1)")
    inductor: list[str] = option(default_factory=list, shape="repeat", metavar="KEY=VALUE",
                                 help="inductor option for kiln-compiled, over kiln's defaults "
                                 "(coordinate_descent_tuning=true on CUDA), e.g. max_autotune=true; repeatable")
