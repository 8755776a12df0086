"""Joining requests' prompts, prefilled together into a scratch cache, one CUDA graph per variant.

A join's prefill runs between decode steps, so all of its time is a pause in every running
stream. Run as Python over per-block compiled layers, the host launches every kernel and checks
dynamo's guards layer by layer; here each variant (prompt bucket T, rows k, padded or not) is
captured once as a CUDA graph over fixed input buffers and replayed, so a join costs two
host-to-device copies, one replay and the copies into its row.

Up to k waiting prompts of the same bucket are prefilled in one forward (k from `PREFILL_ROWS`, at
most `--join-batch`, k x T within the scheduler's prefill budget, so the variants warmed stay few),
each left-padded to T in its own scratch row, masked and positioned from its first token exactly as
when alone. The scratch holds, per layer, one keys and one values buffer [slots, kv heads, head
dim], each viewed as k rows of T slots per variant, so its size is the largest k x T, not k rows of
a whole context. Every layer's keys and values stay separate tensors (here and in the rows): a
compiled block whose mutated inputs share one storage (keys and values as views of one buffer) gets
them through AOTAutograd's "synthetic base", a copy of that whole buffer per call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from kiln.llm.engine import GRAPH_WARMUP_STEPS, bucket_length
from kiln.llm.model import Decoder, KVCache
from kiln.serve.row_sampling import pick_tokens
from kiln.timing import side_stream

PREFILL_ROWS = (1, 2, 4)
"""Prompts prefilled in one forward: a fixed set, so warm-up compiles and captures few variants."""


@dataclass(frozen=True)
class RowSettings:
    """One request's sampling, as the row keeps it."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


def prefill_sizes(bucket: int, budget: int, most: int = max(PREFILL_ROWS)) -> list[int]:
    """Rows prefilled together for prompt bucket `bucket` within `budget` prompt tokens: 1 always,
    larger k from PREFILL_ROWS up to `most` while k x bucket fits."""
    return [k for k in PREFILL_ROWS if k == 1 or (k <= most and k * bucket <= budget)]


def split_sizes(n: int, sizes: list[int]) -> list[int]:
    """`n` prompts as batches of `sizes` (which holds 1), largest first: 7 of (1, 2, 4) is 4, 2, 1."""
    out = []
    for k in sorted(sizes, reverse=True):
        while n >= k:
            out.append(k)
            n -= k
    return out


def scratch_cache(k: list[Tensor], v: list[Tensor], rows: int, T: int) -> KVCache:
    """A KVCache of `rows` rows of `T` slots over the first rows x T slots of each layer's scratch
    buffers `k`, `v` ([slots, kv heads, head dim]); views, so a prefill writes the scratch."""
    cache = KVCache.__new__(KVCache)
    cache.k = [t[:rows * T].unflatten(0, (rows, T)) for t in k]
    cache.v = [t[:rows * T].unflatten(0, (rows, T)) for t in v]
    cache.batch, cache.capacity = rows, T
    return cache


def row_prefill(model: Decoder, tokens: Tensor, pad: Tensor | None, cache: KVCache, temperature: Tensor,
                top_k: Tensor, top_p: Tensor, seed: Tensor, length: Tensor) -> Tensor:
    """Left-padded prompts [k, T] into the scratch cache; returns their first new tokens [k]."""
    logits = model(tokens, cache=cache, pad=pad, last_only=True)
    return pick_tokens(logits[:, -1].float(), temperature, top_k, top_p, seed, length, False)


@dataclass
class _Variant:
    """One (bucket, rows, padded) prefill: fixed input and output buffers, and its graph once captured."""

    ints: Tensor
    """[k T + 4 k] long: tokens, pad, length, top_k, seed, one host copy fills them."""
    floats: Tensor
    """[2 k] fp32: temperature, top_p."""
    first: Tensor
    cache: KVCache
    graph: torch.cuda.CUDAGraph | None = None
    runs: int = 0

    def args(self, k: int, T: int, padded: bool) -> tuple:
        i, f = self.ints, self.floats
        tokens, pad, length = i[:k * T].view(k, T), i[k * T:k * T + k], i[k * T + k:k * T + 2 * k]
        top_k, seed = i[k * T + 2 * k:k * T + 3 * k], i[k * T + 3 * k:]
        return tokens, pad if padded else None, self.cache, f[:k], top_k, f[k:], seed, length


class JoinPrefill:
    """Prefill of 1..k prompts of one bucket into a scratch cache of `slots` slots (the largest
    k x T used); `fn` is row_prefill, compiled or not; `installed` puts the compiled blocks in place."""

    def __init__(self, model: Decoder, *, slots: int, fn: Callable, cuda_graphs: bool,
                 installed: Callable[[], contextlib.AbstractContextManager]):
        config, weight = model.config, model.embed.weight
        self.model, self.fn, self.cuda_graphs, self.installed = model, fn, cuda_graphs, installed
        self.device = weight.device
        shape = (slots, config.n_kv_heads, config.head_dim)
        self.k = [torch.zeros(shape, dtype=weight.dtype, device=self.device) for _ in range(config.n_layers)]
        self.v = [torch.zeros(shape, dtype=weight.dtype, device=self.device) for _ in range(config.n_layers)]
        self.slots = slots
        self._variants: dict[tuple[int, int, bool], _Variant] = {}
        self._pool = None

    def scratch(self, k: int, T: int) -> KVCache:
        """The keys/values the last prefill of k rows of bucket T wrote: per layer [k, T, heads, dim]."""
        return scratch_cache(self.k, self.v, k, T)

    def run(self, prompts: list[list[int]], settings: list[RowSettings]) -> tuple[Tensor, dict[str, Tensor]]:
        """Prefill `prompts` (one bucket) left-padded to it: their first tokens [k] and their sampling
        settings by name ([k] each), on the device and not read (the next run overwrites them)."""
        k, T = len(prompts), bucket_length(max(map(len, prompts)))
        padded = any(len(p) != T for p in prompts)
        v = self._variant(k, T, padded)
        ints = torch.zeros(k * T + 4 * k, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ints[i * T + T - len(prompt):(i + 1) * T] = torch.as_tensor(prompt, dtype=torch.long)
        ints[k * T:] = torch.tensor([[T - len(p) for p in prompts], [len(p) for p in prompts],
                                     [s.top_k for s in settings], [s.seed for s in settings]]).view(-1)
        floats = torch.tensor([[s.temperature for s in settings], [s.top_p for s in settings]],
                              dtype=torch.float32).view(-1)
        v.ints.copy_(ints, non_blocking=True)  # staged from pageable memory: no wait for the running step
        v.floats.copy_(floats, non_blocking=True)
        self._replay(v, k, T, padded)
        args = v.args(k, T, padded)
        return v.first, dict(zip(("temperature", "top_k", "top_p", "seed"), args[3:7], strict=True))

    def _variant(self, k: int, T: int, padded: bool) -> _Variant:
        key = (k, T, padded)
        if key not in self._variants:
            if k * T > self.slots:
                raise RuntimeError(f"{k} prompts of bucket {T} exceed the scratch's {self.slots} slots")
            dev = self.device
            self._variants[key] = _Variant(
                ints=torch.zeros(k * T + 4 * k, dtype=torch.long, device=dev),
                floats=torch.zeros(2 * k, dtype=torch.float32, device=dev),
                first=torch.zeros(k, dtype=torch.long, device=dev),
                cache=self.scratch(k, T))
        return self._variants[key]

    def _replay(self, v: _Variant, k: int, T: int, padded: bool) -> None:
        if v.graph is not None:
            v.graph.replay()
            return
        args = v.args(k, T, padded)
        if not self.cuda_graphs:
            with self.installed():
                v.first.copy_(self.fn(self.model, *args))
            return
        with side_stream(self.device), self.installed():  # warm up off the capture, as the decode step does
            v.first.copy_(self.fn(self.model, *args))
        v.runs += 1
        if v.runs >= GRAPH_WARMUP_STEPS:
            if self._pool is None:  # one memory pool for every prefill graph: they never run at once
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool), self.installed():
                v.first.copy_(self.fn(self.model, *args))
            v.graph = graph
