"""The generation engine: static KV cache, compiled prefill per padded length, decode step compiled
and captured in a CUDA graph.

One `generate` call:
1. `prepare`: prompts are left-padded to a bucket length (16, 32, ..., 1024, then multiples of
   512), so prefill compiles once per bucket rather than once per prompt length; the device
   buffers (`Slots`: cache, tokens, positions, flags, sampling parameters) are allocated once per
   (batch, capacity) and reused, so their addresses stay fixed for CUDA graphs.
2. `run_prefill`: one forward over the prompt, writing the cache, logits of the last position
   only, first token sampled on the device. On CUDA a compiled variant run GRAPH_WARMUP_STEPS times is
   captured as a CUDA graph and replayed from then on (`PREFILL_GRAPHS`): a warmed engine's
   prefill launches nothing from the host, as a server's does (kiln.serve.join_prefill), and a
   one-shot `generate` captures nothing.
3. `run_decode`: each step reads the newest token from the token buffer at the device position,
   writes its key/value slot, samples the next token into the buffer and advances the position,
   all in place, so on CUDA the whole step is one graph replay. The host reads nothing per token;
   with stop tokens it reads the "all rows done" flag every `stop_check_interval` steps.
Compiled variants (prefill per bucket, decode per batch/capacity; greedy or sampled) are counted
with the seconds their first call took (compile + autotuning): `Engine.compiled`. `compile_scope`
says what is compiled: the whole step (`step`) or each repeated block once (`blocks`,
kiln.llm.block_compile: a shorter warm-up for some fusion).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, get_args

import torch
from torch import Tensor

from kiln.compile_cache import cache_use, reason
from kiln.errors import ConfigError
from kiln.llm.block_compile import BlockParts, CompileScope, blocks_installed, compiled_block_parts
from kiln.llm.decode_attention import check as check_decode_attention
from kiln.llm.decode_matvec import check as check_decode_matvec
from kiln.llm.families import takes_kernel
from kiln.llm.kernels import use_decode_kernels
from kiln.llm.model import Decoder, KVCache
from kiln.llm.sampling import Sampling, check_sampling, sample
from kiln.timing import StepClock, side_stream, time_calls

MAX_STOP_TOKENS = 16
# Decode steps run on a side stream before a CUDA graph is captured (lazy initialisation of
# cuBLAS/Triton state must not happen during capture: CUDA graphs docs, "warm up before capture").
GRAPH_WARMUP_STEPS = 2
PREFILL_GRAPHS = True
"""Capture each compiled prefill variant (bucket, greedy or sampled) of at most PREFILL_GRAPH_TOKENS tokens
as a CUDA graph on its GRAPH_WARMUP_STEPS-th call, when the engine uses CUDA graphs (an eager prefill,
`compile_prefill=False`, stays eager: it was never checked for capture). A compiled prefill
still launches each of its few hundred kernels from the host, which kept the GPU idle for part of
a 512-token prefill; the graphs share one memory pool (prefills never run at once). False: every
prefill runs as compiled (comparisons)."""
PREFILL_GRAPH_TOKENS = 8192
"""Batch x padded length up to which a prefill is captured: beyond it the GPU's work outlasts the
host's launches, and a graph would only keep its activations' memory."""


def default_inductor_options(device: torch.device) -> dict[str, Any]:
    # Batch-1 decode is matrix-vector products; with coordinate descent tuning inductor lowers
    # M=1 matmuls to tuned reductions, which reach far more of the memory bandwidth (gpt-fast).
    return {"coordinate_descent_tuning": True} if device.type == "cuda" else {}


def bucket_length(n: int) -> int:
    """Padded prompt length: powers of two from 16 to 1024, then multiples of 512."""
    if n > 1024:
        return -(-n // 512) * 512
    return max(16, 1 << (n - 1).bit_length())


@dataclass
class Slots:
    """Device buffers of one (batch, capacity); a captured decode graph reads and writes them."""

    cache: KVCache
    tokens: Tensor
    """[B, capacity] long: left-padded prompt, then generated tokens."""
    pad: Tensor
    """[B] long: padding slots at the start of each row."""
    pos: Tensor
    """[1] long: slot of the newest token (the next decode step's input)."""
    done: Tensor
    """[B] bool: row has produced a stop token."""
    stop: Tensor
    """[MAX_STOP_TOKENS] long, -1 where unused."""
    temperature: Tensor
    top_k: Tensor
    top_p: Tensor


def _is_stop(tokens: Tensor, stop: Tensor) -> Tensor:
    # A broadcast compare, not torch.isin: eager isin on CUDA may call unique(), a host sync that
    # would also break CUDA-graph capture.
    return (tokens[:, None] == stop[None, :]).any(dim=-1)


def prefill_step(model: Decoder, s: Slots, length: int, padded: bool, greedy: bool) -> None:
    logits = model(s.tokens[:, :length], cache=s.cache, pad=s.pad if padded else None, last_only=True)
    first = sample(logits[:, -1].float(), greedy, s.temperature, s.top_k, s.top_p)
    s.tokens[:, length] = first
    s.pos.fill_(length)
    s.done.copy_(_is_stop(first, s.stop))


def decode_step(model: Decoder, s: Slots, greedy: bool) -> None:
    token = s.tokens.index_select(1, s.pos)  # [B, 1]
    logits = model(token, cache=s.cache, pad=s.pad, decode_slot=s.pos)
    nxt = sample(logits[:, -1].float(), greedy, s.temperature, s.top_k, s.top_p)
    s.tokens.index_copy_(1, s.pos + 1, nxt.view(-1, 1))
    s.done.logical_or_(_is_stop(nxt, s.stop))
    s.pos.add_(1)


@dataclass(frozen=True)
class Prepared:
    """A batch of prompts written into the slots, ready for `run_prefill`."""

    prompt_lens: tuple[int, ...]
    padded_len: int
    max_new_tokens: int
    greedy: bool
    stops: bool


@dataclass
class Generation:
    tokens: list[list[int]]
    """Generated tokens per row, up to and including the first stop token."""
    finish: list[str]
    """Per row: `stop` (a stop token) or `length` (max_new_tokens reached)."""
    prompt_lens: list[int]
    padded_len: int
    steps: int
    """Decode steps run after the prefill (<= max_new_tokens - 1)."""


def check_lengths(prompt_lens: Sequence[int], max_new_tokens: int, *, max_positions: int, max_seq_len: int | None,
                  keys: dict[str, str] | None = None) -> None:
    """The max-length guard: ConfigError naming the offending setting (or flag, through `keys`)."""
    key = {"max_new_tokens": "max_new_tokens", "max_seq_len": "max_seq_len", "prompt": "prompt", **(keys or {})}
    if not prompt_lens or min(prompt_lens) < 1:
        raise ConfigError(key["prompt"], "every prompt needs at least one token")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(key["max_new_tokens"], f"must be an integer >= 1, got {max_new_tokens!r}")
    longest = max(prompt_lens)
    if longest >= max_positions:  # no room for a single new token: the prompt is at fault
        raise ConfigError(key["prompt"], f"a prompt of {longest} tokens leaves no room to generate in the model's "
                          f"{max_positions} positions (max_position_embeddings); at most {max_positions - 1} tokens")
    if longest + max_new_tokens > max_positions:
        raise ConfigError(key["max_new_tokens"], f"prompt ({longest} tokens) + {max_new_tokens} new tokens exceeds "
                          f"the model's {max_positions} positions (max_position_embeddings); at most "
                          f"{max_positions - longest} new tokens fit after this prompt")
    if max_seq_len is not None and longest + max_new_tokens > max_seq_len:
        raise ConfigError(key["max_seq_len"], f"prompt ({longest} tokens) + {max_new_tokens} new tokens does not fit "
                          f"in {max_seq_len} cache slots; raise it or generate fewer tokens")


class Engine:
    """Generate with a Decoder. `compile`: inductor for prefill and decode; `cuda_graphs` (default:
    on when compiling on CUDA): replay the decode step as one CUDA graph. `compile_prefill` (default:
    `compile`) False leaves prefill eager, saving a whole-model compile per prompt bucket;
    `prefill_inductor_options` (default: `inductor_options`) lets prefill skip decode's tuning.
    `decode_attention`: the decode step's attention kernel, `auto` (`triton` on CUDA where it runs,
    else `matmul`), `matmul`, `flash` or `triton` (kiln.llm.decode_attention). `decode_matvec`: the
    decode step's projections, `auto` (`triton` where it runs, else `inductor`), `inductor` or
    `triton` (kiln.llm.decode_matvec). The chosen kernels are swapped into `model` in place
    (kiln.llm.kernels.use_decode_kernels). `compile_scope`: `step` (the whole step compiled) or
    `blocks` (each repeated block compiled once, kiln.llm.block_compile)."""

    def __init__(self, model: Decoder, *, compile: bool = False, cuda_graphs: bool | None = None,
                 inductor_options: dict[str, Any] | None = None, stop_check_interval: int = 8,
                 compile_prefill: bool | None = None, prefill_inductor_options: dict[str, Any] | None = None,
                 decode_attention: str = "auto", decode_matvec: str = "auto", compile_scope: CompileScope = "step"):
        self.model = model.eval()
        self.config = model.config
        self.device = model.embed.weight.device
        self.dtype = model.embed.weight.dtype
        self.compile = compile
        self.cuda_graphs = (compile and self.device.type == "cuda") if cuda_graphs is None else cuda_graphs
        if self.cuda_graphs and self.device.type != "cuda":
            raise ConfigError("cuda_graphs", f"CUDA graphs need a CUDA device; the model is on {self.device}")
        if compile_scope not in get_args(CompileScope):
            raise ConfigError("compile_scope", f"unknown value {compile_scope!r}", get_args(CompileScope))
        if stop_check_interval < 1:
            raise ConfigError("stop_check_interval", f"must be >= 1, got {stop_check_interval}")
        self.stop_check_interval = stop_check_interval
        # `auto` is the plain path for a family whose modules do not take kiln's kernels (its spec).
        if decode_attention == "auto" and not takes_kernel(self.config.family, "decode_attention"):
            decode_attention = "matmul"
        if decode_matvec == "auto" and not takes_kernel(self.config.family, "decode_matvec"):
            decode_matvec = "inductor"
        self.decode_kernel = check_decode_attention(decode_attention, self.device, self.dtype, self.config.head_dim)
        self.decode_matvec = check_decode_matvec(decode_matvec, self.device, self.dtype)
        use_decode_kernels(self.model, attention=self.decode_kernel, matvec=self.decode_matvec)
        self.inductor_options = default_inductor_options(self.device) if inductor_options is None else inductor_options
        self.compile_prefill = compile if compile_prefill is None else compile_prefill
        prefill_options = self.inductor_options if prefill_inductor_options is None else prefill_inductor_options
        self.compile_scope = compile_scope
        kwargs = {"fullgraph": True, "dynamic": False}
        whole = compile_scope == "step"
        self._prefill = torch.compile(prefill_step, **kwargs, options=prefill_options or None) \
            if self.compile_prefill and whole else prefill_step
        self._decode = torch.compile(decode_step, **kwargs, options=self.inductor_options or None) \
            if compile and whole else decode_step
        self._prefill_blocks = compiled_block_parts(model, prefill_options, edges=False) \
            if self.compile_prefill and not whole else None
        # `blocks` keeps the step's edges eager (kiln.llm.block_compile): compiling them lengthens a one-shot
        # run's warm-up by seconds to save a few percent of a decode step; a server (kiln.serve.rows) takes them.
        self._decode_blocks = compiled_block_parts(model, self.inductor_options, edges=False) \
            if compile and not whole else None
        self.slots: Slots | None = None
        self._graphs: dict[bool, torch.cuda.CUDAGraph] = {}
        self._prefill_graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self._prefill_calls: dict[str, int] = {}
        self._prefill_pool: tuple | None = None
        self.compiled: dict[str, float] = {}
        """Variant -> seconds of its first call (compile and tuning included); compiled engines only."""
        self.graph_cache: dict[str, dict[str, Any]] = {}
        """Variant -> what its first call loaded from the compile caches and built anew (graphs and Triton
        kernels: kiln.compile_cache.CacheUse.counts): why that call took the time it did (a warm start
        loads, a cold one compiles). As written to results.json and generate's --json."""

    # -- buffers --------------------------------------------------------------------------------

    def _slots_for(self, batch: int, capacity: int) -> Slots:
        s = self.slots
        if s is not None and s.cache.batch == batch and s.cache.capacity >= capacity:
            return s
        self._graphs.clear()  # they point at the old buffers
        self._prefill_graphs.clear()
        self._prefill_calls.clear()
        self.slots = None
        dev = self.device
        self.slots = Slots(
            cache=KVCache(self.config, batch, capacity, dtype=self.dtype, device=dev),
            tokens=torch.zeros(batch, capacity, dtype=torch.long, device=dev),
            pad=torch.zeros(batch, dtype=torch.long, device=dev),
            pos=torch.zeros(1, dtype=torch.long, device=dev),
            done=torch.zeros(batch, dtype=torch.bool, device=dev),
            stop=torch.full((MAX_STOP_TOKENS,), -1, dtype=torch.long, device=dev),
            temperature=torch.ones((), dtype=torch.float32, device=dev),
            top_k=torch.zeros((), dtype=torch.long, device=dev),
            top_p=torch.ones((), dtype=torch.float32, device=dev),
        )
        return self.slots

    @torch.inference_mode()
    def prepare(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, sampling: Sampling = Sampling(),
                stop_tokens: Sequence[int] = (), max_seq_len: int | None = None) -> Prepared:
        """Check the request and write it into the device buffers (allocated on first use)."""
        lens = [len(p) for p in prompts]
        check_lengths(lens, max_new_tokens, max_positions=self.config.max_positions, max_seq_len=max_seq_len)
        check_sampling(sampling)
        vocab = self.config.vocab_size
        bad = next((t for p in prompts for t in p if not 0 <= t < vocab), None)
        if bad is not None:
            raise ConfigError("prompt", f"token id {bad} is outside the vocabulary [0, {vocab})")
        stops = sorted({int(t) for t in stop_tokens})
        if len(stops) > MAX_STOP_TOKENS:
            raise ConfigError("stop_tokens", f"at most {MAX_STOP_TOKENS} stop tokens, got {len(stops)}")
        padded = bucket_length(max(lens))
        if max_seq_len is not None and padded + max_new_tokens > max_seq_len:
            padded = max_seq_len - max_new_tokens  # an odd length compiles once more, but fits
        s = self._slots_for(len(prompts), max_seq_len or padded + max_new_tokens)
        rows = torch.zeros(len(prompts), padded, dtype=torch.long)
        for i, p in enumerate(prompts):
            rows[i, padded - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
        s.tokens[:, :padded].copy_(rows, non_blocking=True)
        s.pad.copy_(torch.as_tensor([padded - n for n in lens]), non_blocking=True)
        s.stop.fill_(-1)
        if stops:
            s.stop[: len(stops)].copy_(torch.as_tensor(stops), non_blocking=True)
        s.temperature.fill_(sampling.temperature if not sampling.greedy else 1.0)
        s.top_k.fill_(sampling.top_k)
        s.top_p.fill_(sampling.top_p)
        return Prepared(tuple(lens), padded, max_new_tokens, sampling.greedy, bool(stops))

    # -- running --------------------------------------------------------------------------------

    def _first_call(self, name: str, fn, *args) -> None:
        """Call a compiled variant for the first time: raise dynamo's recompile limit (each prefill
        bucket is a specialisation of the same function) and record how long compiling took."""
        import torch._dynamo.config as dynamo_config

        limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
        with dynamo_config.patch({limit: 64}), cache_use() as use:
            self.compiled[name] = time_calls(lambda: fn(*args), calls=1, device=self.device)
        self.graph_cache[name] = use.counts()

    def _call(self, name: str, fn, blocks: BlockParts | None, *args) -> None:
        with self._blocks(blocks):
            if (blocks is not None or fn not in (prefill_step, decode_step)) and name not in self.compiled:
                self._first_call(name, fn, *args)
            else:
                fn(*args)

    def _blocks(self, blocks: BlockParts | None) -> contextlib.AbstractContextManager:
        return blocks_installed(self.model, blocks) if blocks is not None else contextlib.nullcontext()

    @torch.inference_mode()
    def run_prefill(self, prep: Prepared) -> None:
        padded = any(n != prep.padded_len for n in prep.prompt_lens)
        s = self.slots
        name = f"prefill[b{s.cache.batch},len{prep.padded_len},cap{s.cache.capacity}{',pad' if padded else ''}" \
               f"{',greedy' if prep.greedy else ',sampled'}]"
        args = (self.model, s, prep.padded_len, padded, prep.greedy)
        graph = self._prefill_graphs.get(name)
        if graph is not None:
            graph.replay()
            return
        if not (self.cuda_graphs and self.compile_prefill and PREFILL_GRAPHS
                and s.cache.batch * prep.padded_len <= PREFILL_GRAPH_TOKENS):
            self._call(name, self._prefill, self._prefill_blocks, *args)
            return
        calls = self._prefill_calls[name] = self._prefill_calls.get(name, 0) + 1
        if self._prefill_pool is None:
            self._prefill_pool = torch.cuda.graph_pool_handle()
        graph = self._warm_then_capture(name, self._prefill, self._prefill_blocks, args,
                                        capture=calls >= GRAPH_WARMUP_STEPS, pool=self._prefill_pool)
        if graph is not None:
            self._prefill_graphs[name] = graph

    @torch.inference_mode()
    def run_decode(self, prep: Prepared, steps: int, clock: StepClock | None = None) -> int:
        """Run up to `steps` decode steps; returns how many ran (fewer when every row stopped)."""
        s = self.slots
        name = f"decode[b{s.cache.batch},cap{s.cache.capacity}{',greedy' if prep.greedy else ',sampled'}]"
        for i in range(steps):
            self._decode_once(name, prep.greedy, s, warmups_left=GRAPH_WARMUP_STEPS - i)
            if clock is not None:
                clock.mark()
            if prep.stops and (i + 1) % self.stop_check_interval == 0 and bool(s.done.all()):
                return i + 1
        return steps

    def _decode_once(self, name: str, greedy: bool, s: Slots, warmups_left: int) -> None:
        graph = self._graphs.get(greedy)
        if graph is not None:
            graph.replay()
            return
        if not self.cuda_graphs:
            self._call(name, self._decode, self._decode_blocks, self.model, s, greedy)
            return
        graph = self._warm_then_capture(name, self._decode, self._decode_blocks, (self.model, s, greedy),
                                        capture=warmups_left <= 1)
        if graph is not None:
            self._graphs[greedy] = graph

    def _warm_then_capture(self, name: str, fn, blocks: BlockParts | None, args: tuple, *, capture: bool,
                           pool: tuple | None = None) -> torch.cuda.CUDAGraph | None:
        """Run `fn(*args)` on a side stream (compiling on its first call: lazy initialisation must not
        happen during capture), then, if `capture`, record it as a CUDA graph. Capturing runs
        nothing, so the side-stream call is this call's real work."""
        with side_stream(self.device):
            self._call(name, fn, blocks, *args)
        if not capture:
            return None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool), self._blocks(blocks):
            fn(*args)
        return graph

    @torch.inference_mode()
    def collect(self, prep: Prepared, steps: int) -> Generation:
        s = self.slots
        out = s.tokens[:, prep.padded_len: prep.padded_len + steps + 1].tolist()
        stops = set(s.stop.tolist()) - {-1}
        tokens, finish = [], []
        for row in out:
            cut = next((i for i, t in enumerate(row) if t in stops), None)
            tokens.append(row if cut is None else row[: cut + 1])
            finish.append("length" if cut is None else "stop")
        return Generation(tokens, finish, list(prep.prompt_lens), prep.padded_len, steps)

    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, sampling: Sampling = Sampling(),
                 stop_tokens: Sequence[int] = (), seed: int | None = None, max_seq_len: int | None = None,
                 clock: StepClock | None = None) -> Generation:
        """Up to `max_new_tokens` tokens per prompt (token ids). `seed` seeds torch's generators
        for sampling; `clock` gets a start, then a mark per token (the first after prefill)."""
        if clock is not None:
            clock.start()
        prep = self.prepare(prompts, max_new_tokens=max_new_tokens, sampling=sampling, stop_tokens=stop_tokens,
                            max_seq_len=max_seq_len)
        if seed is not None:
            torch.manual_seed(seed)
        self.run_prefill(prep)
        if clock is not None:
            clock.mark()
        steps = 0
        if not (prep.stops and bool(self.slots.done.all())):
            steps = self.run_decode(prep, max_new_tokens - 1, clock)
        return self.collect(prep, steps)

    @property
    def cache_bytes(self) -> int:
        return self.slots.cache.nbytes if self.slots is not None else 0


def warmup_reasons(compiled: dict[str, float], graph_cache: dict[str, dict[str, Any]]) -> str:
    """Each compiled variant's first-call seconds and why (kiln.compile_cache.reason): `decode 2.2 s
    (1 graph compiled (traced in 2.1 s, inductor 9.0 s); 3 Triton kernels compiled in 1.9 s)`; the
    variant's kind only (its shape dropped)."""
    parts = []
    for name, seconds in compiled.items():
        why = reason(graph_cache.get(name, {}))
        parts.append(f"{name.split('[')[0]} {seconds:.1f} s" + (f" ({why})" if why else ""))
    return ", ".join(parts)
