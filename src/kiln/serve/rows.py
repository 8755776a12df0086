"""The server's device side: a fixed set of KV-cache rows that requests join and leave mid-run.

Design (continuous batching on kiln's static cache, kiln.llm.engine's layout kept):
- `rows` rows of `capacity` slots are allocated once at start, so memory is fixed and a full
  server refuses work (HTTP 429) rather than running out of it.
- All rows share one decode cursor `pos` (the slot the next step reads and writes), as in
  kiln.llm.engine, so the decode step keeps the model's and the decode kernels' one-slot shape and
  stays one CUDA graph per batch bucket. Requests join at cursor P: their prompts (L tokens each,
  up to a few of one prompt bucket together) are prefilled into a scratch cache
  (kiln.serve.join_prefill: padded to kiln's prompt buckets, one CUDA graph per variant) and each
  one's keys/values are copied into slots P-L..P-1 of a free row, whose `pad` becomes P-L; RoPE
  positions count from the row's first real token, so they match the scratch's. The first token is
  sampled from the prefill's logits and written at slot P.
- The decode step runs over the first `bucket` rows (powers of two up to `rows`, the smallest that
  holds every busy row; new requests take the lowest free row). Free rows inside the bucket are
  computed and ignored: shapes never change, nothing recompiles, a graph is replayed.
- A request admitted at P needs L <= P and P + max_tokens <= capacity. When the cursor is too far,
  every row shifts left by up to the smallest pad of the busy rows (slots before it are padding
  for everyone), freeing room at the end; when it is too early for a long prompt, every row shifts
  right if the busy rows' ends leave room; with no busy row the cursor is simply reset. A shift
  copies the rows' cache once; otherwise the request waits (first come, first served).
The host reads the newest token of each busy row after every step (streaming needs each token),
one step late: step t+1 is started before step t's tokens are handed on, so the device computes
while the host works (a row that finished at step t has run one step more, which is ignored).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo.config as dynamo_config
from torch import Tensor

from kiln.llm.block_compile import BlockParts, CompileScope, blocks_installed, compiled_block_parts, compiled_edge
from kiln.llm.engine import GRAPH_WARMUP_STEPS, bucket_length
from kiln.llm.model import Decoder, KVCache
from kiln.serve.join_prefill import (
    JoinPrefill,
    RowSettings,
    prefill_sizes,
    row_prefill,
    split_sizes,
)
from kiln.serve.row_sampling import pick_tokens
from kiln.timing import side_stream

__all__ = ["Launched", "RowBuffers", "RowSettings", "Rows", "batch_buckets", "cache_rows", "finish_row_decode", "row_decode_step"]


def batch_buckets(rows: int, chosen: list[int] | None = None) -> list[int]:
    """Decode batch sizes compiled (one CUDA graph each): `chosen` (sorted, `rows` added), else
    powers of two below `rows`, then `rows`."""
    if chosen:
        return sorted({*chosen, rows})
    out, b = [], 1
    while b < rows:
        out.append(b)
        b *= 2
    return [*out, rows]


def cache_rows(cache: KVCache, n: int) -> KVCache:
    """A view of the first `n` rows of `cache` (same storage; fixed addresses for graphs)."""
    view = KVCache.__new__(KVCache)
    view.k, view.v = [t[:n] for t in cache.k], [t[:n] for t in cache.v]
    view.batch, view.capacity = n, cache.capacity
    return view


@dataclass
class RowBuffers:
    """Device buffers of the rows (or a view of the first rows); a captured step reads and writes them."""

    cache: KVCache
    tokens: Tensor
    """[R, capacity] long: each row's newest token sits at the cursor."""
    pad: Tensor
    """[R] long: slots before the row's first prompt token."""
    pos: Tensor
    """[1] long: the shared cursor, the slot of the next step's input token."""
    temperature: Tensor
    """[R] fp32, 0 = greedy."""
    top_k: Tensor
    top_p: Tensor
    seed: Tensor

    def head(self, n: int) -> RowBuffers:
        return RowBuffers(cache_rows(self.cache, n), self.tokens[:n], self.pad[:n], self.pos,
                          self.temperature[:n], self.top_k[:n], self.top_p[:n], self.seed[:n])


def row_decode_step(model: Decoder, b: RowBuffers, greedy_only: bool, finish: Callable | None = None) -> None:
    """One token for every row: read the token at the cursor, write its key/value slot, choose the
    next token into the slot after it, advance the cursor; all on the device. `finish` (default
    `finish_row_decode`; a compiled copy in `blocks` scope) does the choosing and advancing."""
    token = b.tokens.index_select(1, b.pos)
    logits = model(token, cache=b.cache, pad=b.pad, decode_slot=b.pos)
    (finish or finish_row_decode)(b, logits, greedy_only)


def finish_row_decode(b: RowBuffers, logits: Tensor, greedy_only: bool) -> None:
    nxt = pick_tokens(logits[:, -1].float(), b.temperature, b.top_k, b.top_p, b.seed, b.pos + 1 - b.pad,
                      greedy_only)
    b.tokens.index_copy_(1, b.pos + 1, nxt.view(-1, 1))
    b.pos.add_(1)


@dataclass(frozen=True)
class Launched:
    """A decode step started and not yet read: the busy rows then, where their tokens land."""

    rows: list[int]
    host: Tensor
    event: Any
    """Recorded after the step and its copy (a CUDA event with timing; None off CUDA)."""
    start: Any = None
    """Recorded before the step."""
    after: Any = None
    """The end of the device work before the step (the previous step, a join's prefill, a shift)."""


class Rows:
    """`rows` KV-cache rows of `capacity` slots over `model`; not thread-safe (one scheduler thread)."""

    def __init__(self, model: Decoder, *, rows: int, capacity: int, compile: bool, cuda_graphs: bool,
                 buckets: list[int] | None = None, inductor_options: dict[str, Any] | None = None,
                 compile_scope: CompileScope = "blocks", prefill_tokens: int = 512, join_batch: int = 1):
        self.model, self.config = model, model.config
        dev, dtype = model.embed.weight.device, model.embed.weight.dtype
        self.device, self.rows, self.capacity, self.cuda_graphs = dev, rows, capacity, cuda_graphs
        self.prefill_tokens, self.join_batch = prefill_tokens, join_batch
        """The scheduler's prompt tokens per iteration, and the most prompts prefilled in one forward:
        which batches of joins are prefilled together (each size is one more warm-up variant)."""
        self.buf = RowBuffers(
            cache=KVCache(self.config, rows, capacity, dtype=dtype, device=dev),
            tokens=torch.zeros(rows, capacity, dtype=torch.long, device=dev),
            pad=torch.zeros(rows, dtype=torch.long, device=dev),
            pos=torch.zeros(1, dtype=torch.long, device=dev),
            temperature=torch.zeros(rows, dtype=torch.float32, device=dev),
            top_k=torch.zeros(rows, dtype=torch.long, device=dev),
            top_p=torch.ones(rows, dtype=torch.float32, device=dev),
            seed=torch.zeros(rows, dtype=torch.long, device=dev))
        self.buckets = batch_buckets(rows, buckets)
        self.views = {n: self.buf.head(n) for n in self.buckets}
        kwargs = {"fullgraph": True, "dynamic": False}
        # One compiled variant per prompt bucket and per batch bucket: above dynamo's default limit.
        limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
        self._limits = dynamo_config.patch({limit: 64})
        # Decode takes the tuned options (its matrix-vector products); prefill, compiled once per prompt
        # bucket, skips the tuning (as `kiln bench llm --tuning decode` does).
        # `blocks` (kiln.llm.block_compile): each repeated block compiled once for every layer, bucket
        # and prompt length, so warming every variant takes seconds; `step`: the whole step per variant.
        # The decode step's edges (attention inputs, logits, sampling) are compiled too: a few seconds
        # more warm-up per batch bucket, a few percent off every step (more with sampled requests).
        whole, blocks = compile and compile_scope == "step", compile and compile_scope == "blocks"
        self._decode = self._limits(torch.compile(row_decode_step, **kwargs, options=inductor_options or None)) \
            if whole else self._limits(functools.partial(row_decode_step, finish=compiled_edge(
                finish_row_decode, inductor_options))) if blocks else row_decode_step
        self._prefill = self._limits(torch.compile(row_prefill, **kwargs)) if whole \
            else self._limits(row_prefill) if blocks else row_prefill
        self._decode_blocks = compiled_block_parts(model, inductor_options, edges=True) if blocks else None
        self._prefill_blocks = compiled_block_parts(model, None, edges=False) if blocks else None
        longest = bucket_length(capacity)  # the largest k x T a batch of joins may take, within the budget
        self.prefill = JoinPrefill(model, slots=max(longest, min(prefill_tokens, join_batch * longest)),
                                   fn=self._prefill, cuda_graphs=cuda_graphs,
                                   installed=lambda: self._blocks(self._prefill_blocks))
        self._graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self._warm: dict[tuple[int, bool], int] = {}
        pinned = self.device.type == "cuda"
        self._host = [torch.zeros(rows, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self._flip = 0
        self._last_end: Any = None
        """The timing event after the last device work (a step, a join, a shift): Launched.after."""
        self.cursor = 0
        """Host copy of `pos`."""
        self.busy: dict[int, int] = {}
        """Busy row -> its pad."""
        self.ends: dict[int, int] = {}
        """Busy row -> the cursor it must not pass (its last token's slot + 1)."""
        self.greedy: dict[int, bool] = {}

    # -- admission -------------------------------------------------------------------------------

    def free_row(self) -> int | None:
        return next((r for r in range(self.rows) if r not in self.busy), None)

    def free_rows(self, n: int) -> list[int]:
        """Up to `n` free rows, lowest first (a lower row keeps the decode bucket small)."""
        return [r for r in range(self.rows) if r not in self.busy][:n]

    def prefill_sizes(self, bucket: int) -> list[int]:
        """How many prompts of `bucket` are prefilled in one forward (each is warmed)."""
        return prefill_sizes(bucket, self.prefill_tokens, self.join_batch)

    def place(self, prompt_len: int, max_tokens: int) -> bool:
        """Move the cursor so that a prompt of `prompt_len` fits before it and `max_tokens` after
        (prompt_len + max_tokens <= capacity, checked by the caller), shifting every row left (into
        slots no busy row uses) or right (into room after every busy row's end); False: no shift
        fits now, wait for rows to finish."""
        if not self.busy:
            self.buf.pad.zero_()  # free rows' pads stay <= the cursor, as kernels over [pad, cursor] expect
            self._set_cursor(prompt_len)
            return True
        p = self.cursor
        if prompt_len <= p <= self.capacity - max_tokens:
            return True
        if p < prompt_len:  # right, just enough for the prompt
            shift = prompt_len - p
            if shift > self.capacity - max(self.ends.values()) or prompt_len + max_tokens > self.capacity:
                return False
        else:  # left, as far as the busy rows' padding allows (room for later requests too)
            shift = -min(min(self.busy.values()), p - prompt_len)
            if p + shift + max_tokens > self.capacity:
                return False
        self._shift(shift)
        return True

    def _set_cursor(self, p: int) -> None:
        self.cursor = p
        self.buf.pos.fill_(p)

    @torch.inference_mode()
    def _shift(self, shift: int) -> None:
        """Move every row's slots by `shift` (< 0: left); no busy row's token leaves the rows. Only
        the rows up to the last busy one are copied: a free row's slots are written before they
        are read (a joining prompt's, then each step's), and the copy is the whole live span of
        every row it covers."""
        p, b, n = self.cursor, self.buf, max(self.busy) + 1
        src, dst = (slice(-shift, p + 1), slice(0, p + 1 + shift)) if shift < 0 else \
            (slice(0, p + 1), slice(shift, p + 1 + shift))
        for t in (*b.cache.k, *b.cache.v, b.tokens):
            t[:n, dst] = t[:n, src].clone()
        b.pad.add_(shift).clamp_(min=0)
        self._last_end = self._mark()
        self.busy = {r: pad + shift for r, pad in self.busy.items()}
        self.ends = {r: end + shift for r, end in self.ends.items()}
        self._set_cursor(p + shift)

    def join(self, row: int, prompt: list[int], max_tokens: int, settings: RowSettings) -> int:
        """Prefill `prompt` into free `row` so that it ends at the cursor (after `place`); returns
        the first new token (already at the cursor's slot)."""
        return self.join_many([(row, prompt, max_tokens, settings)])[0]

    @torch.inference_mode()
    def join_many(self, joins: list[tuple[int, list[int], int, RowSettings]]) -> list[int]:
        """Prefill the prompts of `joins` (row, prompt, max_tokens, settings; free rows, prompts of
        one bucket, `place`d for the longest prompt and max_tokens) so that each ends at the cursor,
        in batches of `prefill_sizes`; their first new tokens, read with one wait for the device."""
        p, b = self.cursor, self.buf
        T = bucket_length(max(len(prompt) for _, prompt, _, _ in joins))
        done = 0
        for k in split_sizes(len(joins), self.prefill_sizes(T)):
            batch = joins[done:done + k]
            first, settings = self.prefill.run([prompt for _, prompt, _, _ in batch], [s for *_, s in batch])
            scratch = self.prefill.scratch(k, T)
            for i, (row, prompt, max_tokens, sampling) in enumerate(batch):
                n = len(prompt)
                for dst, src in zip((*b.cache.k, *b.cache.v), (*scratch.k, *scratch.v), strict=True):
                    dst[row, p - n:p] = src[i, T - n:]
                for name, value in settings.items():
                    getattr(b, name)[row:row + 1].copy_(value[i:i + 1])
                b.tokens[row, p:p + 1].copy_(first[i:i + 1])
                b.pad[row] = p - n
                self.busy[row], self.ends[row] = p - n, p + max_tokens
                self.greedy[row] = sampling.temperature == 0
            done += k
        self._last_end = self._mark()
        return b.tokens[[row for row, *_ in joins], p].tolist()

    # -- warm-up (before the server takes requests) ----------------------------------------------

    @torch.inference_mode()
    def warm_prefill(self, bucket: int, padded: bool, k: int = 1) -> None:
        """Compile (and capture) the prefill of `k` prompts of bucket `bucket` (`padded`: prompts
        shorter than it, else ones that fill it) by prefilling dummy prompts; the rows are untouched."""
        prompt = [0] * (bucket - 1 if padded else bucket)
        for _ in range(GRAPH_WARMUP_STEPS + 1 if self.cuda_graphs else 1):
            self.prefill.run([prompt] * k, [RowSettings()] * k)

    @torch.inference_mode()
    def warm_decode(self, n: int, greedy_only: bool) -> None:
        """Compile (and capture as a CUDA graph) the decode step of batch bucket `n`, with no row
        busy; the cursor, tokens and pads are reset after (the dummy keys/values are never read:
        a request's slots are written before its row attends to them)."""
        if self.busy:
            raise RuntimeError("warm-up runs before any request: rows are busy")
        key = (n, greedy_only)
        self._run(n, greedy_only)
        while self.cuda_graphs and key not in self._graphs:
            self._run(n, greedy_only)
        self.buf.tokens.zero_()
        self.buf.pad.zero_()
        self._set_cursor(0)

    def leave(self, row: int) -> None:
        self.busy.pop(row, None)
        self.ends.pop(row, None)
        self.greedy.pop(row, None)

    # -- decoding --------------------------------------------------------------------------------

    def bucket(self) -> int:
        top = max(self.busy) + 1
        return next(n for n in self.buckets if n >= top)

    @torch.inference_mode()
    def launch(self) -> Launched | None:
        """Start one decode step over the bucket holding every busy row, and the copy of its new
        tokens to the host, without waiting for either (None: the cursor is at the rows' end, every
        busy row has all its tokens). The host reads them with `collect`, after starting the next."""
        if self.cursor + 1 >= self.capacity:
            return None
        n = self.bucket()
        after, start = self._last_end, self._mark()
        self._run(n, all(self.greedy.values()))
        self.cursor += 1
        host = self._host[self._flip]  # two buffers: the next step's copy never overwrites one unread
        self._flip ^= 1
        host[:n].copy_(self.buf.tokens[:n, self.cursor], non_blocking=True)
        self._last_end = self._mark()
        return Launched(list(self.busy), host, self._last_end, start, after)

    def collect(self, launched: Launched) -> dict[int, int]:
        """Busy row (at launch) -> its new token, once the step is done."""
        if launched.event is not None:
            launched.event.synchronize()
        values = launched.host.tolist()
        return {r: values[r] for r in launched.rows}

    @staticmethod
    def step_times(launched: Launched) -> tuple[float, float | None] | None:
        """(device seconds of the step, seconds the device sat idle before it: from the end of the
        work before it to its start, 0 when it was queued in time; None after a fresh start) of a
        collected step; None off CUDA. Idle time is the host starting the step late."""
        if launched.start is None:
            return None
        idle = None if launched.after is None else max(0.0, launched.after.elapsed_time(launched.start)) / 1e3
        return launched.start.elapsed_time(launched.event) / 1e3, idle

    def _mark(self) -> Any:
        """A timing event recorded now on the device's stream (None off CUDA)."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def step(self) -> dict[int, int]:
        """One decode step, waited for: busy row -> its new token."""
        launched = self.launch()
        return self.collect(launched) if launched is not None else {}

    def _run(self, n: int, greedy_only: bool) -> None:
        key = (n, greedy_only)
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
            return
        view = self.views[n]
        if not self.cuda_graphs:
            with self._blocks(self._decode_blocks):
                self._decode(self.model, view, greedy_only)
            return
        with side_stream(self.device), self._blocks(self._decode_blocks):  # warm up off the capture
            self._decode(self.model, view, greedy_only)
        self._warm[key] = self._warm.get(key, 0) + 1
        if self._warm[key] >= GRAPH_WARMUP_STEPS:
            graph = torch.cuda.CUDAGraph()
            pos = self.buf.pos.clone()
            with torch.cuda.graph(graph), self._blocks(self._decode_blocks):
                self._decode(self.model, view, greedy_only)
            self.buf.pos.copy_(pos)  # capture runs nothing, but keep the cursor exact regardless
            self._graphs[key] = graph

    def _blocks(self, blocks: BlockParts | None) -> contextlib.AbstractContextManager:
        return blocks_installed(self.model, blocks) if blocks is not None else contextlib.nullcontext()
