"""The server's device side: a fixed set of KV-cache rows that requests join and leave mid-run.

Design (continuous batching on kiln's static cache, kiln.llm.engine's layout kept):
- `rows` rows of `capacity` slots are allocated once at start, so memory is fixed and a full
  server refuses work (HTTP 429) rather than running out of it.
- All rows share one decode cursor `pos` (the slot the next step reads and writes), as in
  kiln.llm.engine, so the decode step keeps the model's and the decode kernels' one-slot shape and
  stays one CUDA graph per batch bucket. A request joins at cursor P: its prompt (L tokens) is
  prefilled alone into a one-row scratch cache (padded to kiln's prompt buckets, so prefill
  compiles once per bucket) and its keys/values are copied into slots P-L..P-1 of a free row, whose
  `pad` becomes P-L; RoPE positions count from the row's first real token, so they match the
  scratch's. The first token is sampled from the prefill's logits and written at slot P.
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
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo.config as dynamo_config
from torch import Tensor

from kiln.llm.block_compile import CompileScope, blocks_installed, compiled_block_forwards
from kiln.llm.engine import GRAPH_WARMUP_STEPS, bucket_length
from kiln.llm.model import Decoder, KVCache
from kiln.serve.row_sampling import pick_tokens


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


def row_decode_step(model: Decoder, b: RowBuffers, greedy_only: bool) -> None:
    """One token for every row: read the token at the cursor, write its key/value slot, choose the
    next token into the slot after it, advance the cursor; all on the device."""
    token = b.tokens.index_select(1, b.pos)
    logits = model(token, cache=b.cache, pad=b.pad, decode_slot=b.pos)
    nxt = pick_tokens(logits[:, -1].float(), b.temperature, b.top_k, b.top_p, b.seed, b.pos + 1 - b.pad,
                      greedy_only)
    b.tokens.index_copy_(1, b.pos + 1, nxt.view(-1, 1))
    b.pos.add_(1)


def row_prefill(model: Decoder, tokens: Tensor, pad: Tensor | None, cache: KVCache, temperature: Tensor,
                top_k: Tensor, top_p: Tensor, seed: Tensor, length: Tensor) -> Tensor:
    """A left-padded prompt [1, T] into the scratch cache; returns its first new token [1]."""
    logits = model(tokens, cache=cache, pad=pad, last_only=True)
    return pick_tokens(logits[:, -1].float(), temperature, top_k, top_p, seed, length, False)


@dataclass(frozen=True)
class Launched:
    """A decode step started and not yet read: the busy rows then, where their tokens land."""

    rows: list[int]
    host: Tensor
    event: Any


@dataclass(frozen=True)
class RowSettings:
    """One request's sampling, as the row keeps it."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


class Rows:
    """`rows` KV-cache rows of `capacity` slots over `model`; not thread-safe (one scheduler thread)."""

    def __init__(self, model: Decoder, *, rows: int, capacity: int, compile: bool, cuda_graphs: bool,
                 buckets: list[int] | None = None, inductor_options: dict[str, Any] | None = None,
                 compile_scope: CompileScope = "blocks"):
        self.model, self.config = model, model.config
        dev, dtype = model.embed.weight.device, model.embed.weight.dtype
        self.device, self.rows, self.capacity, self.cuda_graphs = dev, rows, capacity, cuda_graphs
        self.buf = RowBuffers(
            cache=KVCache(self.config, rows, capacity, dtype=dtype, device=dev),
            tokens=torch.zeros(rows, capacity, dtype=torch.long, device=dev),
            pad=torch.zeros(rows, dtype=torch.long, device=dev),
            pos=torch.zeros(1, dtype=torch.long, device=dev),
            temperature=torch.zeros(rows, dtype=torch.float32, device=dev),
            top_k=torch.zeros(rows, dtype=torch.long, device=dev),
            top_p=torch.ones(rows, dtype=torch.float32, device=dev),
            seed=torch.zeros(rows, dtype=torch.long, device=dev))
        self.scratch = KVCache(self.config, 1, bucket_length(capacity), dtype=dtype, device=dev)
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
        whole, blocks = compile and compile_scope == "step", compile and compile_scope == "blocks"
        self._decode = self._limits(torch.compile(row_decode_step, **kwargs, options=inductor_options or None)) \
            if whole else self._limits(row_decode_step) if blocks else row_decode_step
        self._prefill = self._limits(torch.compile(row_prefill, **kwargs)) if whole \
            else self._limits(row_prefill) if blocks else row_prefill
        self._decode_blocks = compiled_block_forwards(model, inductor_options) if blocks else None
        self._prefill_blocks = compiled_block_forwards(model, None) if blocks else None
        self._graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self._warm: dict[tuple[int, bool], int] = {}
        pinned = self.device.type == "cuda"
        self._host = [torch.zeros(rows, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self._flip = 0
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
        self.busy = {r: pad + shift for r, pad in self.busy.items()}
        self.ends = {r: end + shift for r, end in self.ends.items()}
        self._set_cursor(p + shift)

    @torch.inference_mode()
    def join(self, row: int, prompt: list[int], max_tokens: int, settings: RowSettings) -> int:
        """Prefill `prompt` into free `row` so that it ends at the cursor (after `place`); returns
        the first new token (already at the cursor's slot)."""
        n, p, b = len(prompt), self.cursor, self.buf
        padded = bucket_length(n)
        first, settings_t = self._prefill_alone(prompt, settings)
        for name, value in settings_t.items():
            getattr(b, name)[row: row + 1].copy_(value)
        for dst, src in zip((*b.cache.k, *b.cache.v), (*self.scratch.k, *self.scratch.v)):
            dst[row, p - n: p] = src[0, padded - n: padded]
        b.tokens[row, p] = first[0]
        b.pad[row] = p - n
        self.busy[row] = p - n
        self.ends[row] = p + max_tokens
        self.greedy[row] = settings.temperature == 0
        return int(first[0])

    def _prefill_alone(self, prompt: list[int], settings: RowSettings) -> tuple[Tensor, dict[str, Tensor]]:
        """`prompt` left-padded to its bucket and prefilled into the scratch cache: its first new
        token [1] and its sampling settings as device tensors (one compiled variant per bucket, and
        per padded or not: an unpadded prompt takes the flash path)."""
        n, dev = len(prompt), self.device
        padded = bucket_length(n)
        tokens = torch.zeros(1, padded, dtype=torch.long)
        tokens[0, padded - n:] = torch.as_tensor(prompt, dtype=torch.long)
        pad = torch.tensor([padded - n], device=dev) if padded != n else None
        values = {"temperature": torch.tensor([settings.temperature], dtype=torch.float32, device=dev),
                  "top_k": torch.tensor([settings.top_k], dtype=torch.long, device=dev),
                  "top_p": torch.tensor([settings.top_p], dtype=torch.float32, device=dev),
                  "seed": torch.tensor([settings.seed], dtype=torch.long, device=dev)}
        with self._blocks(self._prefill_blocks):
            first = self._prefill(self.model, tokens.to(dev), pad, self.scratch, *values.values(),
                                  torch.tensor([n], device=dev))
        return first, values

    # -- warm-up (before the server takes requests) ----------------------------------------------

    @torch.inference_mode()
    def warm_prefill(self, bucket: int, padded: bool) -> None:
        """Compile the prefill of prompt bucket `bucket` (`padded`: a prompt shorter than it, else
        one that fills it) by prefilling a dummy prompt; the rows are untouched."""
        self._prefill_alone([0] * (bucket - 1 if padded else bucket), RowSettings())

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
        self._run(n, all(self.greedy.values()))
        self.cursor += 1
        host = self._host[self._flip]  # two buffers: the next step's copy never overwrites one unread
        self._flip ^= 1
        host[:n].copy_(self.buf.tokens[:n, self.cursor], non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return Launched(list(self.busy), host, event)

    def collect(self, launched: Launched) -> dict[int, int]:
        """Busy row (at launch) -> its new token, once the step is done."""
        if launched.event is not None:
            launched.event.synchronize()
        values = launched.host.tolist()
        return {r: values[r] for r in launched.rows}

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
        stream = torch.cuda.Stream(self.device)  # warm up off the capture, as kiln.llm.engine does
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), self._blocks(self._decode_blocks):
            self._decode(self.model, view, greedy_only)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self._warm[key] = self._warm.get(key, 0) + 1
        if self._warm[key] >= GRAPH_WARMUP_STEPS:
            graph = torch.cuda.CUDAGraph()
            pos = self.buf.pos.clone()
            with torch.cuda.graph(graph), self._blocks(self._decode_blocks):
                self._decode(self.model, view, greedy_only)
            self.buf.pos.copy_(pos)  # capture runs nothing, but keep the cursor exact regardless
            self._graphs[key] = graph

    def _blocks(self, blocks: list | None) -> contextlib.AbstractContextManager:
        return blocks_installed(self.model, blocks) if blocks is not None else contextlib.nullcontext()
