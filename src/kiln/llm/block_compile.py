"""Compile a decoder's repeated block once and reuse it for every layer (`compile_scope="blocks"`).

Compiling the whole prefill or decode step traces all of a model's layers one after the other:
dynamo's tracing, which a warm start still pays in full, grows with the layer count. Compiled per
block, the layers share one traced and compiled function (dynamo keys its cache on the block's
code; the block's parameters are inputs, not constants), so a 28-layer model is traced about
once per shape instead of 28 times. A decode step's edges may be compiled too (`edges=True`), each
a small graph of its own: the attention inputs built before the first block (positions, RoPE
angles, masks), the logits after the last (final norm, LM head) and, through `compiled_edge`, what
the step does with them (sampling, the cursor). Eager, they are a few dozen small kernels per step,
a few percent of its time (a sampled step's vocabulary-wide arithmetic unfused); compiled, they are
several more graphs to warm per batch size. A server, which warms once and decodes for hours,
takes them (kiln.serve.rows); a one-shot `kiln generate` does not (kiln.llm.engine). The embedding
lookup stays eager (one kernel), and so do a prefill's edges.

The compiled functions are installed on the model only while the engine runs (`blocks_installed`),
so a model shared with another engine stays as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from kiln.config.schema import CompileScope

__all__ = ["BlockParts", "CompileScope", "blocks_installed", "compiled_block_parts", "compiled_edge"]

EDGES = ("attention_inputs", "logits")
"""The Decoder methods called before the first block and after the last, compiled with the blocks."""
EDGE_TUNING = False
"""True: the edges are compiled with the blocks' coordinate-descent tuning too. Off, their few small
kernels take inductor's default launch settings: on an H200 tuning them added seconds to every
decode variant's warm-up and nothing measurable to the step."""


@dataclass(frozen=True)
class BlockParts:
    """What `blocks` compiles of a model: one forward per layer (all sharing dynamo's cache entries)
    and one per edge method (EDGES)."""

    layers: list[Callable]
    edges: dict[str, Callable]


def _compiled(fn: Callable, options: dict[str, Any] | None) -> Callable:
    return torch.compile(fn, fullgraph=True, dynamic=False, options=options or None)


def compiled_edge(fn: Callable, options: dict[str, Any] | None) -> Callable:
    """`fn`, an edge of the step, compiled as one graph per shape with the blocks' inductor `options`
    as edges take them: without coordinate-descent tuning unless EDGE_TUNING."""
    if not EDGE_TUNING and options:
        options = {k: v for k, v in options.items() if k != "coordinate_descent_tuning"}
    return _compiled(fn, options)


def compiled_block_parts(model: torch.nn.Module, options: dict[str, Any] | None, *, edges: bool) -> BlockParts:
    """The layers' forwards compiled with `options`, and with `edges` the model's edge methods as
    `compiled_edge` (for decode steps: in a prefill they are a sliver of its time, and each would be
    one more graph to compile per prompt bucket)."""
    return BlockParts([_compiled(layer.forward, options) for layer in model.layers],
                      {name: compiled_edge(getattr(model, name), options) for name in EDGES} if edges else {})


@contextlib.contextmanager
def blocks_installed(model: torch.nn.Module, parts: BlockParts) -> Iterator[None]:
    """Within the block, each layer's `forward` and the model's edge methods are the compiled ones;
    what was there before (an instance attribute set by someone else, e.g. activation
    checkpointing, or none) is put back after."""
    owners = [*model.layers, *(model for _ in parts.edges)]
    names = ["forward"] * len(parts.layers) + list(parts.edges)
    fns = [*parts.layers, *parts.edges.values()]
    saved = [owner.__dict__.get(name) for owner, name in zip(owners, names, strict=True)]
    for owner, name, fn in zip(owners, names, fns, strict=True):
        setattr(owner, name, fn)
    try:
        yield
    finally:
        for owner, name, own in zip(owners, names, saved, strict=True):
            if own is None:
                delattr(owner, name)
            else:
                setattr(owner, name, own)
