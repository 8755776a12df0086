"""torch.compile from a validated CompileConfig: keyword arguments, scopes and regional compile.

Scopes (what one compiled region covers):
- `model`:      the module's forward (compiled in place, so state_dict keys stay unprefixed);
- `model+loss`: forward and loss in one graph, so the loss fuses with the last layers;
- `step`:       forward + loss, and the optimizer update (clip + step) as a second compiled
                function. Dynamo breaks the graph at `backward()`, which autograd runs over the
                compiled forward's backward graph; the learning rate is a tensor so the scheduler
                does not trigger a recompile each step (PyTorch recipe "compiling the optimizer
                with an LR scheduler").
Regional compilation compiles each repeated block instead of the whole model: one block is
compiled and reused by the others, which cuts compile time by about the block count
(PyTorch recipe "regional compilation").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kiln.config.schema import CompileConfig


def compile_kwargs(cfg: CompileConfig) -> dict[str, Any]:
    """Keyword arguments for torch.compile. Assumes the config was validated (mode xor options).

    Under whole-step capture (`cudagraphs`) the compiled code is recorded into kiln's own CUDA
    graph, so a mode that records graphs itself (reduce-overhead, max-autotune) is passed as its
    inductor options without `triton.cudagraphs` (a graph cannot be captured inside a capture)."""
    kwargs: dict[str, Any] = {"backend": cfg.backend, "fullgraph": cfg.fullgraph}
    if cfg.mode:
        kwargs["mode"] = cfg.mode
    if cfg.options:
        kwargs["options"] = dict(cfg.options)
    if cfg.cudagraphs and cfg.backend == "inductor":
        import torch._inductor

        options = dict(cfg.options) if cfg.options else dict(torch._inductor.list_mode_options().get(cfg.mode, {}))
        if options.get("triton.cudagraphs"):
            kwargs.pop("mode", None)
            options.pop("triton.cudagraphs")
            if options:
                kwargs["options"] = options
            else:
                kwargs.pop("options", None)
    kwargs["dynamic"] = cfg.dynamic  # None (auto): torch decides after a recompile
    return kwargs


def apply_compile(model: torch.nn.Module, cfg: CompileConfig, blocks: list[torch.nn.Module]) -> torch.nn.Module:
    """Compile the model in place for scope `model` (whole or regional); other scopes compile
    functions around it (see `compile_function`), so the module is returned unchanged."""
    if not cfg.enabled or cfg.scope != "model":
        return model
    kwargs = compile_kwargs(cfg)
    if cfg.regional:
        if not blocks:
            raise ValueError("compile.regional: the model has no repeated blocks to compile; set compile.regional=false")
        for block in blocks:
            block.compile(**kwargs)
        return model
    model.compile(**kwargs)
    return model


def cuda_graph_mode_note(cfg: CompileConfig, device_type: str) -> str | None:
    """What a compile mode that records CUDA graphs (reduce-overhead, max-autotune) does off CUDA:
    the graphs are skipped, so it compiles as the mode without them; None when that does not apply."""
    if not cfg.enabled or device_type == "cuda" or cfg.backend not in ("", "inductor") or not cfg.mode:
        return None
    import torch._inductor

    if not torch._inductor.list_mode_options().get(cfg.mode, {}).get("triton.cudagraphs"):
        return None
    return (f"compile.mode={cfg.mode} records CUDA graphs, which a {device_type.upper()} run has none of: it compiles "
            f"here without them (kiln bench compile skips such recipes off CUDA as CUDA-only)")


def compile_function(fn: Callable, cfg: CompileConfig) -> Callable:
    return torch.compile(fn, **compile_kwargs(cfg))


def recompiles() -> int | None:
    """Compilations beyond the first, per frame, since dynamo's last reset (dynamo keeps no
    single counter for this; FRAME_COMPILE_COUNTER counts compiles per code object)."""
    from torch._dynamo import convert_frame

    per_frame = getattr(convert_frame, "FRAME_COMPILE_COUNTER", None)
    if per_frame is None:
        return None
    return int(sum(max(0, n - 1) for n in per_frame.values()))


def compile_counters() -> dict[str, int | None]:
    """Graph, graph-break and recompile counts dynamo has recorded since its last reset."""
    from torch._dynamo.utils import counters

    return {
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "recompiles": recompiles(),
    }
