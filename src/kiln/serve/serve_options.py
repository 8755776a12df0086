"""What `kiln serve` is asked to do: one field per flag (kiln.config.options), unchecked;
kiln.serve.server.check_serve checks it. Imports no torch: the CLI builds its parser from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from kiln.config.options import option
from kiln.config.schema import CompileScope
from kiln.generate import llm_flags as llm

Compile = Literal["auto", "on", "off"]
API_KEY_ENV = "KILN_API_KEY"


@dataclass
class ServeOptions:
    """`kiln serve`'s request, one field per flag."""

    model: str | None = llm.model_option(required=True)
    device: str = llm.device_option()
    dtype: str = llm.dtype_option()
    quant: str = llm.quant_option()
    group_size: int | None = llm.group_size_option()
    quant_backend: str = llm.quant_backend_option()
    quant_lm_head: bool = llm.quant_lm_head_option()
    decode_attention: str = llm.decode_attention_option()
    decode_matvec: str = llm.decode_matvec_option()
    compile: Compile = option("auto", choices=get_args(Compile),
                              help="compile prefill/decode and replay decode as CUDA graphs (auto: on for CUDA)")
    compile_scope: CompileScope = llm.compile_scope_option()
    host: str = option("127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    port: int = option(8000, help="TCP port (default 8000)")
    max_batch: int = option(8, help="KV-cache rows: requests decoded at once (default 8); fixed at start")
    batch_buckets: list[int] = option(default_factory=list, shape="comma",
                                      help="decode batch sizes compiled, one CUDA graph each, comma-separated "
                                      "(default: powers of two up to --max-batch); fewer buckets, less warm-up")
    max_queue: int = option(64, help="requests waiting for a row beyond --max-batch; more get HTTP 429 (default 64)")
    max_seq_len: int | None = option(None, help="slots per KV-cache row: prompt + max_tokens of one request "
                                     "(default: the model's positions, at most 2048)")
    prefill_tokens: int = option(512, help="prompt tokens prefilled per scheduler iteration between decode steps: "
                                 "bounds how long joining requests pause the running streams (default 512; one "
                                 "waiting request always gets its turn)")
    join_batch: int = option(1, help="most waiting prompts of one prompt bucket prefilled in one forward: 1, 2 or 4 "
                             "(default 1), within --prefill-tokens; each size above 1 adds a warm-up variant per "
                             "prompt bucket it fits")
    no_warmup: bool = option(False, shape="switch", help="bind at once and compile each decode batch bucket and "
                             "prompt bucket on first use, under load (tests, CPU); by default all are compiled "
                             "before the port is bound")
    warmup_prompt_buckets: list[int] = option(default_factory=list, shape="comma",
                                              help="prompt buckets warmed, comma-separated (default: every bucket "
                                              "up to --max-seq-len); others compile on first use")
    api_key: str | None = option(None, record="never", help=f"require 'Authorization: Bearer KEY' on every route "
                                 f"but /health (default: ${API_KEY_ENV} if set, else none)")
    served_model_name: str | None = option(None, help="the model id clients send (default: the --model "
                                           "directory's name)")
    drain_s: float = option(10.0, help="on SIGINT/SIGTERM, seconds in-flight requests get to finish before "
                            "they are cancelled (default 10)")
    random_weights: bool = option(False, shape="switch", help="serve random weights when the --model directory has "
                                  "none (the output is noise: load tests)")
    seed: int = option(0, help="seed of random weights (default 0)")
