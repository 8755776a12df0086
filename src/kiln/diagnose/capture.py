"""Record what torch.compile did: graphs and their ops, graph breaks, and recompiles with their guards.

Three sources, because none sees everything (checked on torch 2.6 .. 2.13):
- a recording backend wraps the real one and sees every graph (ops, and the user line of each op
  from the node's `stack_trace`); a graph's `compile_subgraph_reason` is what
  `torch._dynamo.explain` reads, but a break whose partial graph has no ops never reaches a backend;
- `torch._dynamo.utils.graph_break_reasons` holds every break that produced a (possibly empty)
  partial graph, with the user stack;
- the `graph_breaks` log artifact (TORCH_LOGS=graph_breaks) also names breaks after which dynamo
  gave up on the whole function ("graph break in loop", frame skipped: it then runs eagerly).
Recompiles come from `torch._dynamo.utils.guard_failures`, which dynamo fills on every cache miss
(the data behind TORCH_LOGS=recompiles).
These are internals (see "torch.compile Troubleshooting" in the PyTorch docs for the public log
switches); each is read with a fallback, so a torch that renames one loses that source only.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.diagnose.frames import Place, place_from_summaries, place_from_text, source_line
from kiln.diagnose.runtime import quiet_torch

_SKIP_MARKERS = ("Skipping the function", "results in a skip", "skip tracing the frame", "frame skipped")


@dataclass
class GraphInfo:
    index: int
    kind: str
    """`dynamo` (a captured forward graph), or `aot_forward` / `aot_backward` (AOTAutograd graphs, --train)."""
    ops: list[str]
    op_places: list[tuple[str, Place | None]] = field(default_factory=list)


@dataclass
class RawBreak:
    reason: str
    place: Place | None
    source: str
    """`dynamo` (graph_break_reasons) or `log` (graph_breaks artifact only)."""
    frame_skipped: bool = False
    count: int = 1


@dataclass
class RawRecompile:
    function: str
    guard: str
    reason: str
    place: Place | None
    entries_checked: int
    code_id: int = 0
    """id() of the code object that recompiled, and `ordinal`: this miss's index among its misses."""
    ordinal: int = 0


def op_name(node: torch.fx.Node) -> str:
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module":
        return f"module:{node.target}"
    target = node.target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    name = getattr(target, "__name__", None) or str(target)
    module = getattr(target, "__module__", None) or ""
    if module in ("_operator", "operator", "builtins"):
        return name
    if module.startswith("torch") or module == "":
        # torch.conv2d is a builtin with no __module__; torch.nn.functional.relu has one.
        short = module.replace("torch.nn.functional", "F").replace("torch._C._nn", "F")
        return f"{short}.{name}" if short and short != "torch._C._VariableFunctions" else f"torch.{name}"
    return f"{module}.{name}"


class DynamoCapture:
    """What one diagnosis saw; filled while `capture_dynamo()` is active."""

    def __init__(self) -> None:
        self.graphs: list[GraphInfo] = []
        self.breaks: list[RawBreak] = []
        self.recompiles: list[RawRecompile] = []
        self.log_messages: list[str] = []

    def record_graph(self, gm: torch.fx.GraphModule, kind: str) -> None:
        nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
        places = [(op_name(n), place_from_text(n.meta.get("stack_trace") or "")) for n in nodes]
        self.graphs.append(GraphInfo(len(self.graphs), kind, [p[0] for p in places], places))

    def backend(self, inner: str | Callable, train: bool = False) -> Callable:
        """A torch.compile backend that records each graph, then hands it to `inner`. With `train` and
        inner `aot_eager`, AOTAutograd's forward and backward graphs are recorded too."""
        from torch._dynamo.backends.registry import lookup_backend

        if train and inner == "aot_eager":
            from functorch.compile import make_boxed_func
            from torch._dynamo.backends.common import aot_autograd

            def compiler(kind: str):
                def compile_graph(gm, example_inputs):
                    self.record_graph(gm, kind)
                    return make_boxed_func(gm.forward)

                return compile_graph

            inner_fn = aot_autograd(fw_compiler=compiler("aot_forward"), bw_compiler=compiler("aot_backward"))
        else:
            inner_fn = lookup_backend(inner)

        def recording_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]):
            self.record_graph(gm, "dynamo")
            return inner_fn(gm, example_inputs)

        return recording_backend

    # --- collection at the end of the capture ---------------------------------------------------

    def _add_break(self, brk: RawBreak) -> None:
        for seen in self.breaks:
            same_place = seen.place and brk.place and (seen.place.file, seen.place.line) == (brk.place.file, brk.place.line)
            if same_place or (seen.place is None and brk.place is None and seen.reason == brk.reason):
                seen.count += 1
                seen.frame_skipped = seen.frame_skipped or brk.frame_skipped
                return
        self.breaks.append(brk)

    def collect(self) -> None:
        from torch._dynamo import utils as dynamo_utils

        for reason in list(getattr(dynamo_utils, "graph_break_reasons", [])):
            text = str(getattr(reason, "reason", reason))
            self._add_break(RawBreak(text, place_from_summaries(getattr(reason, "user_stack", None)), "dynamo"))
        for message in self.log_messages:
            parsed = _parse_break_log(message)
            if parsed:
                self._add_break(parsed)
        failures = getattr(dynamo_utils, "guard_failures", {})
        for code, reasons in list(failures.items()):
            self.recompiles.extend(_group_recompiles(code, list(reasons)))

    @staticmethod
    def recompile_counts() -> dict[int, int]:
        """Recompiles so far per code object (id -> count); snapshots taken between calls tell
        which call caused which recompile (guard_failures is only grouped at `collect`)."""
        from torch._dynamo import utils as dynamo_utils

        failures = getattr(dynamo_utils, "guard_failures", {})
        return {id(code): len(_group_recompiles(code, list(reasons))) for code, reasons in list(failures.items())}


def _parse_break_log(message: str) -> RawBreak | None:
    """One graph_breaks log message -> a break (formats of torch 2.6 .. 2.13)."""
    if "Graph break" not in message:
        return None
    skipped = any(marker in message for marker in _SKIP_MARKERS)
    m = re.search(r"(?:Graph Break Reason|Reason):\s*(.*?)(?:\n\s*\n\s*(?:User code traceback|Stack variable)|\Z)",
                  message, re.S)
    reason = m.group(1).strip() if m else message.strip()
    for marker in ("User code traceback:", "following user code:"):
        if marker in message:
            place = place_from_text(message.split(marker, 1)[1])
            break
    else:
        loc = re.search(r"in user code at (\S+):(\d+)", message)
        place = Place(loc[1], int(loc[2]), source_line(loc[1], int(loc[2]))) if loc else None
    return RawBreak(reason, place, "log", frame_skipped=skipped)


_COMPILE_ID = re.compile(r"^\[?(\d+)/(\d+)\]?:?\s*")


def _group_recompiles(code: Any, reasons: list[str]) -> list[RawRecompile]:
    """guard_failures lists, per cache miss, one reason per cached entry, newest entry first; a miss
    starts where the entry index stops decreasing. Each miss is one recompile."""
    events: list[list[tuple[int, str]]] = []
    last = None
    for text in reasons:
        m = _COMPILE_ID.match(text)
        idx = int(m[2]) if m else 0
        body = text[m.end():] if m else text
        if last is None or idx >= last:
            events.append([])
        events[-1].append((idx, body))
        last = idx
    out = []
    for ordinal, event in enumerate(events):
        body = event[0][1]
        guard_text, _, stack = body.partition("User stack trace:")
        guard = guard_text.strip().splitlines()[0] if guard_text.strip() else body
        guard = guard.split("  #")[0].strip()
        place = place_from_text(stack) if stack else None
        if place is None:
            file, line = code.co_filename, code.co_firstlineno
            place = Place(file, line, source_line(file, line), code.co_name)
        out.append(RawRecompile(code.co_name, guard, body.strip(), place, len(event), id(code), ordinal))
    return out


class _ListHandler(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record must not break the diagnosis
            return
        if record.exc_info and record.exc_info[1] is not None:
            text += f"\nGraph Break Reason: {record.exc_info[1]}"
        self.sink.append(text)


@contextlib.contextmanager
def _graph_break_log(sink: list[str]) -> Iterator[None]:
    """Listen to the `graph_breaks` artifact loggers without printing them; restore them after."""
    import torch._dynamo.convert_frame  # noqa: F401  (creates the artifact loggers)
    import torch._dynamo.symbolic_convert  # noqa: F401

    names = [n for n in logging.root.manager.loggerDict if n.startswith("torch.") and n.endswith(".__graph_breaks")]
    handler = _ListHandler(sink)
    saved = []
    for name in names:
        log = logging.getLogger(name)
        saved.append((log, log.level, log.propagate))
        log.setLevel(logging.DEBUG)
        log.propagate = False
        log.addHandler(handler)
    try:
        yield
    finally:
        for log, level, propagate in saved:
            log.removeHandler(handler)
            log.setLevel(level)
            log.propagate = propagate


@contextlib.contextmanager
def capture_dynamo() -> Iterator[DynamoCapture]:
    """Start from a clean dynamo state (torch.compiler.reset), record, and reset again on exit so the
    caller's later compiles are not affected by ours."""
    capture = DynamoCapture()
    torch.compiler.reset()
    try:
        with quiet_torch(), _graph_break_log(capture.log_messages):
            yield capture
            capture.collect()
    finally:
        torch.compiler.reset()
