"""Compile a decoder's repeated block once and reuse it for every layer (`compile_scope="blocks"`).

Compiling the whole prefill or decode step traces all of a model's layers one after the other:
dynamo's tracing, which a warm start still pays in full, grows with the layer count. Compiled per
block, the layers share one traced and compiled function (dynamo keys its cache on the block's
code; the block's parameters are inputs, not constants), so a 28-layer model is traced about
once per shape instead of 28 times. What lies between the blocks (embedding, positions, the final
norm, the LM head, sampling) runs eagerly; a decode step is still captured whole in one CUDA graph,
so the eager parts cost kernel time only, not launches from the host.

The compiled forwards are installed on the blocks only while the engine runs (`blocks_installed`),
so a model shared with another engine stays as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from kiln.config.schema import CompileScope

__all__ = ["CompileScope", "blocks_installed", "compiled_block_forwards"]


def compiled_block_forwards(model: torch.nn.Module, options: dict[str, Any] | None) -> list[Callable]:
    """One compiled forward per layer of `model.layers`, all sharing dynamo's cache entries."""
    return [torch.compile(layer.forward, fullgraph=True, dynamic=False, options=options or None)
            for layer in model.layers]


@contextlib.contextmanager
def blocks_installed(model: torch.nn.Module, forwards: list[Callable]) -> Iterator[None]:
    """Within the block, each layer's `forward` is its compiled one; the layer's own (an instance
    attribute set by someone else, e.g. activation checkpointing, or none) is put back after."""
    layers = list(model.layers)
    saved = [layer.__dict__.get("forward") for layer in layers]
    for layer, fn in zip(layers, forwards, strict=True):
        layer.forward = fn
    try:
        yield
    finally:
        for layer, own in zip(layers, saved, strict=True):
            if own is None:
                del layer.forward
            else:
                layer.forward = own
