"""Find the repeated blocks of a model (transformer layers, MLP blocks).

Regional compilation, FSDP2 wrapping and activation checkpointing all work per block; most models
keep their blocks in one nn.ModuleList / nn.Sequential, so we look for that container instead of
asking every model to declare it.
"""

from __future__ import annotations

from collections import deque

import torch.nn as nn


def _param_count(modules: list[nn.Module]) -> int:
    # Count each parameter once: blocks may share weights (tied layers).
    seen: set[int] = set()
    total = 0
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()  # works for meta tensors too
    return total


def find_repeated_blocks(module: nn.Module, min_repeats: int = 2) -> list[nn.Module]:
    """The children of the ModuleList/Sequential holding most parameters in repeated same-class blocks.

    Searches breadth-first from `module`. In each container, children are grouped by class; a group
    of at least `min_repeats` instances is a candidate, scored by its parameter count. The highest
    score wins; on a tie the shallower container wins (found first), so an outer list of layers
    beats a list nested inside one layer. Returns [] when nothing repeats or the repeats hold no
    parameters (there is nothing to wrap or compile separately).
    """
    best: list[nn.Module] = []
    best_score = 0
    seen: set[int] = set()
    queue: deque[nn.Module] = deque([module])
    while queue:
        current = queue.popleft()
        if id(current) in seen:
            continue
        seen.add(id(current))
        children = list(current.children())
        if isinstance(current, (nn.ModuleList, nn.Sequential)):
            groups: dict[type, list[nn.Module]] = {}
            for child in children:
                groups.setdefault(type(child), []).append(child)
            for group in groups.values():
                if len(group) < min_repeats:
                    continue
                score = _param_count(group)
                if score > best_score:
                    best, best_score = group, score
        queue.extend(children)
    return list(best)
