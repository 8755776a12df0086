"""`kiln serve`'s work: check the flags (ConfigError naming the flag, exit 2, before the model is
built), build and quantize the model, allocate the KV rows once, start the scheduler thread and
run uvicorn until SIGINT/SIGTERM. On a signal uvicorn stops accepting connections and gives
in-flight requests `--drain-s` seconds to finish; then the scheduler ends what is left (an error
event to each) and the command exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kiln.errors import ConfigError
from kiln.generate.llm_checks import at_least, checked_source, device_from_flag, dtype_from_flag, one_quant
from kiln.llm import decode_attention, decode_matvec
from kiln.llm.config import ModelSource
from kiln.llm.engine import default_inductor_options
from kiln.llm.families import takes_kernel
from kiln.llm.kernels import use_decode_kernels
from kiln.llm.quant import QuantSpec, quantize_decoder
from kiln.llm.tokenizer import find_tokenizer, generation_stop_tokens, load_tokenizer
from kiln.llm.weights import TORCH_DTYPES, build_decoder, has_weights
from kiln.models.host_memory import check_generation_fits
from kiln.serve.app import INSTALL_HINT, State, build_app
from kiln.serve.chat import load_chat_template
from kiln.serve.join_prefill import PREFILL_ROWS
from kiln.serve.metrics import ServeMetrics
from kiln.serve.rows import Rows
from kiln.serve.scheduler import Scheduler
from kiln.serve.serve_options import API_KEY_ENV, ServeOptions
from kiln.serve.texts import Served
from kiln.serve.warmup import chosen_prompt_buckets, warm_up

DEFAULT_CONTEXT = 2048
DEVICE_MEMORY_MARGIN = 0.9
"""Share of the device's free memory the KV rows may take (the rest: activations, scratch, graphs)."""
GIL_SWITCH_S = 0.0005
"""Python's thread switch interval while serving, a tenth of its default. The scheduler thread
waits for the decode step with the GIL released; when the step ends it must take the GIL back from
the event loop, which at many streams spends a long stretch per step writing every stream's token.
At the default it can wait that long, and the next step starts late once the host's share of a
step nears the step itself; a shorter interval keeps that wait a small part of a decode step."""


@dataclass
class ServeSetup:
    opts: ServeOptions
    source: ModelSource
    device: torch.device
    dtype: str
    context: int
    quant: QuantSpec
    compile: bool
    api_key: str | None
    name: str
    warmup_buckets: list[int]
    """Prompt buckets warmed before binding (empty with --no-warmup)."""


def check_serve(opts: ServeOptions) -> ServeSetup:
    """The server `opts` asks for; ConfigError naming the flag at fault otherwise."""
    at_least("--max-batch", opts.max_batch, 1)
    at_least("--max-queue", opts.max_queue, 0)
    at_least("--prefill-tokens", opts.prefill_tokens, 1)
    if opts.join_batch not in PREFILL_ROWS:
        raise ConfigError("--join-batch", f"got {opts.join_batch}", tuple(map(str, PREFILL_ROWS)))
    at_least("--max-seq-len", opts.max_seq_len, 2)
    at_least("--drain-s", opts.drain_s, 0)
    if opts.batch_buckets and (min(opts.batch_buckets) < 1 or max(opts.batch_buckets) > opts.max_batch):
        raise ConfigError("--batch-buckets", f"each must be in [1, --max-batch={opts.max_batch}], "
                          f"got {','.join(map(str, opts.batch_buckets))}")
    if not 0 <= opts.port <= 65535:
        raise ConfigError("--port", f"must be in [0, 65535], got {opts.port}")
    if opts.compile not in ("auto", "on", "off"):
        raise ConfigError("--compile", f"unknown value {opts.compile!r}", ("auto", "on", "off"))
    device = device_from_flag(opts.device)
    dtype = dtype_from_flag(opts.dtype, device)
    source = checked_source(opts.model, random_weights=opts.random_weights, device=device, dtype=dtype,
                            attention=opts.decode_attention, matvec=opts.decode_matvec, purpose="serve")
    config = source.config
    context = opts.max_seq_len or min(config.max_positions, DEFAULT_CONTEXT)
    if context > config.max_positions:
        raise ConfigError("--max-seq-len", f"{context} exceeds the model's {config.max_positions} positions")
    quant = one_quant(opts.quant, group_size=opts.group_size, backend=opts.quant_backend, lm_head=opts.quant_lm_head,
                      config=config, device=device, dtype=dtype)
    if device.type == "cpu":  # the rows are allocated at start: refuse what cannot fit
        check_generation_fits(config, dtype=dtype, dtype_bytes=TORCH_DTYPES[dtype].itemsize, rows=opts.max_batch,
                              tokens=context)
    buckets = chosen_prompt_buckets(context, opts.warmup_prompt_buckets)
    if opts.no_warmup and opts.warmup_prompt_buckets:
        raise ConfigError("--warmup-prompt-buckets", "names buckets to warm, and --no-warmup skips warm-up: give one")
    compile_on = opts.compile == "on" or (opts.compile == "auto" and device.type == "cuda")
    api_key = opts.api_key or os.environ.get(API_KEY_ENV) or None
    name = opts.served_model_name or (source.directory.name if source.directory is not None else str(opts.model))
    return ServeSetup(opts, source, device, dtype, context, quant, compile_on, api_key, name,
                      [] if opts.no_warmup else buckets)


def _check_device_memory(setup: ServeSetup, cache_bytes: int) -> None:
    if setup.device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(setup.device)
    if cache_bytes > DEVICE_MEMORY_MARGIN * free:
        raise ConfigError("--max-batch", f"{setup.opts.max_batch} rows of {setup.context} slots need "
                          f"{cache_bytes / 2**30:.1f} GiB of KV cache; {free / 2**30:.1f} GiB of device memory is "
                          "free after the weights: lower --max-batch or --max-seq-len")


def build_rows(setup: ServeSetup, say: Callable[[str], None]) -> Rows:
    opts = setup.opts
    model = build_decoder(setup.source, device=setup.device, dtype=TORCH_DTYPES[setup.dtype], seed=opts.seed)
    if not has_weights(setup.source.directory):
        say(f"kiln: {opts.model} has no weights: random weights, the output is noise")
    if setup.quant.kind != "none":
        model = quantize_decoder(model, setup.quant)
        say(f"kiln: quantized {setup.quant.describe()}")
    config = model.config
    attention = opts.decode_attention
    if attention == "auto" and not takes_kernel(config.family, "decode_attention"):
        attention = "matmul"
    matvec = opts.decode_matvec if takes_kernel(config.family, "decode_matvec") or opts.decode_matvec != "auto" \
        else "inductor"
    dtype = TORCH_DTYPES[setup.dtype]
    use_decode_kernels(model, attention=decode_attention.check(attention, setup.device, dtype, config.head_dim),
                       matvec=decode_matvec.check(matvec, setup.device, dtype))
    kv_bytes = 2 * config.n_layers * config.n_kv_heads * config.head_dim * dtype.itemsize
    _check_device_memory(setup, kv_bytes * opts.max_batch * setup.context)
    return Rows(model.eval(), rows=opts.max_batch, capacity=setup.context, buckets=opts.batch_buckets,
                compile=setup.compile,
                cuda_graphs=setup.compile and setup.device.type == "cuda",
                inductor_options=default_inductor_options(setup.device), compile_scope=opts.compile_scope,
                prefill_tokens=opts.prefill_tokens, join_batch=opts.join_batch)


def served_model(setup: ServeSetup) -> Served:
    directory = setup.source.directory
    tokenizer = load_tokenizer(directory, "--model") if find_tokenizer(directory) else None
    config = setup.source.config
    stops = frozenset(generation_stop_tokens(directory, config.eos_token_ids))
    template = load_chat_template(directory) if tokenizer is not None else None
    return Served(setup.name, tokenizer, template, setup.context, config.vocab_size, stops)


def run_serve(opts: ServeOptions, say: Callable[[str], None]) -> int:
    """Check, load, serve until a signal; 0 after a clean drain."""
    setup = check_serve(opts)
    try:
        import uvicorn
    except ImportError:
        raise ConfigError("kiln serve", f"needs uvicorn and fastapi: {INSTALL_HINT}") from None
    served = served_model(setup)
    rows = build_rows(setup, say)
    metrics = ServeMetrics(setup.name)
    if not opts.no_warmup:  # before the port is bound: no request ever waits for a compile
        metrics.warmed(warm_up(rows, setup.warmup_buckets, say))
    state = State(served, None, metrics, setup.api_key)  # type: ignore[arg-type]
    scheduler = Scheduler(rows, max_queue=opts.max_queue, prefill_tokens=opts.prefill_tokens, sink=state.deliver,
                          metrics=metrics)
    state.scheduler = scheduler
    app = build_app(state)
    config = uvicorn.Config(app, host=opts.host, port=opts.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=max(1, round(opts.drain_s)), lifespan="on")
    server = uvicorn.Server(config)
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: received.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}  # what uvicorn re-raises after its shutdown
    switch = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_S)
    scheduler.start()
    template = "with" if served.template is not None else "without"
    say(f"kiln: serving {setup.name!r} on http://{opts.host}:{opts.port} ({setup.device}, {setup.dtype}, "
        f"{opts.max_batch} rows x {setup.context} slots, queue {opts.max_queue}, {template} a chat template"
        f"{', API key required' if setup.api_key else ''})")
    try:
        server.run()
    finally:
        scheduler.stop()
        sys.setswitchinterval(switch)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise RuntimeError(f"the HTTP server did not start on {opts.host}:{opts.port} (is the port in use?); "
                           "nothing was served")
    say(f"kiln: stopped{' on ' + signal.Signals(received[0]).name if received else ''}; "
        f"{metrics.tokens} tokens served")
    return 0

