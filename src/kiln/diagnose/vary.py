"""`--vary`: call the compiled model again with changed inputs, so recompiles show up with their guards.

    batch[=4,8]      dim 0 of every tensor input (default: 2x and 3x the example's)
    dimN[=16,32]     dim N of every tensor input that has it (e.g. dim1 for sequence length)
    scalars          every Python int/float argument, changed twice
    dtype            floating inputs as float64, int64 inputs as int32
    autocast         the same inputs under torch.autocast (bfloat16)
Two changes per dimension, not one: the first recompiles with the dimension marked dynamic
(automatic dynamic shapes), the second shows whether that took.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from kiln.errors import ConfigError

VARY_FORMS = ("batch", "batch=4,8", "dim1", "dim1=16,32", "scalars", "dtype", "autocast")
DEFAULT_VARY = ("batch", "scalars")
_ITEM = re.compile(r"(?P<kind>batch|dim\d+|scalars|dtype|autocast)(?:=(?P<sizes>\d+(?:,\d+)*))?")


@dataclass
class Variant:
    label: str
    inputs: tuple[Any, ...]
    autocast: bool = False


def parse_vary(texts: list[str] | None) -> list[tuple[str, list[int] | None]]:
    """`--vary` values (repeatable or comma-joined: `batch,scalars`) -> [(kind, sizes or None)]."""
    items: list[tuple[str, list[int] | None]] = []
    for text in texts or []:
        # "batch=4,8,scalars" : a comma followed by a digit continues the size list.
        for part in re.split(r",(?=[a-z])", text.strip()):
            m = _ITEM.fullmatch(part.strip())
            if not m:
                raise ConfigError("--vary", f"cannot parse {part!r}", VARY_FORMS)
            sizes = [int(s) for s in m["sizes"].split(",")] if m["sizes"] else None
            if sizes is not None and m["kind"] in ("scalars", "dtype", "autocast"):
                raise ConfigError("--vary", f"{m['kind']} takes no sizes", VARY_FORMS)
            if sizes is not None and any(s <= 0 for s in sizes):
                raise ConfigError("--vary", f"{part!r}: sizes must be positive", VARY_FORMS)
            items.append((m["kind"], sizes))
    return items


def _resize(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """Same values pattern, new length along `dim` (repeat then cut, so integer ranges stay valid)."""
    reps = [1] * t.dim()
    reps[dim] = -(-size // t.shape[dim])
    return t.repeat(*reps).narrow(dim, 0, size).contiguous()


def _dim_variants(base: tuple[Any, ...], dim: int, sizes: list[int] | None, label: str) -> list[Variant]:
    """Every tensor with that dimension resized, also tensors inside lists, tuples and dicts."""
    tensors = [x for x in tree_leaves(list(base)) if isinstance(x, torch.Tensor) and x.dim() > dim]
    if not tensors:
        return []
    current = tensors[0].shape[dim]
    sizes = [s for s in (sizes or [current * 2, current * 3]) if s != current]
    out = []
    for size in sizes:
        inputs = tree_map(lambda x, size=size: _resize(x, dim, size) if isinstance(x, torch.Tensor) and x.dim() > dim
                          else x, list(base))
        out.append(Variant(f"{label}={size}", tuple(inputs)))
    return out


def _scalar_variants(base: tuple[Any, ...]) -> list[Variant]:
    def change(x: Any, step: int) -> Any:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return x
        return x + step if isinstance(x, int) else x * (1.0 + 0.5 * step) + 0.25 * step

    if not any(isinstance(x, (int, float)) and not isinstance(x, bool) for x in base):
        return []
    out = []
    for step in (1, 2):
        inputs = tuple(change(x, step) for x in base)
        shown = ", ".join(repr(x) for x in inputs if isinstance(x, (int, float)) and not isinstance(x, bool))
        out.append(Variant(f"scalars=({shown})", inputs))
    return out


def _dtype_variant(base: tuple[Any, ...]) -> list[Variant]:
    def cast(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.to(torch.float64)
        if isinstance(x, torch.Tensor) and x.dtype == torch.int64:
            return x.to(torch.int32)
        return x

    inputs = tuple(cast(x) for x in base)
    changed = any(isinstance(a, torch.Tensor) and a.dtype != b.dtype for a, b in zip(inputs, base))
    return [Variant("dtype=" + ",".join(str(x.dtype).removeprefix("torch.") for x in inputs
                                        if isinstance(x, torch.Tensor)), inputs)] if changed else []


def make_variants(base: tuple[Any, ...], vary: list[tuple[str, list[int] | None]]) -> tuple[list[Variant], list[str]]:
    """(variants, notes); a note says when a requested kind had nothing to vary."""
    variants: list[Variant] = []
    notes: list[str] = []
    for kind, sizes in vary:
        if kind == "batch":
            found = _dim_variants(base, 0, sizes, "batch")
        elif kind.startswith("dim"):
            found = _dim_variants(base, int(kind[3:]), sizes, kind)
        elif kind == "scalars":
            found = _scalar_variants(base)
        elif kind == "dtype":
            found = _dtype_variant(base)
        else:
            found = [Variant("autocast=bfloat16", base, autocast=True)]
        if not found:
            notes.append(f"--vary {kind}: the inputs have nothing to vary")
        variants.extend(found)
    return variants, notes
