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
(the data behind TORCH_LOGS=recompiles); the `dynamic` log names the user line that pins a dynamic
size to one value (the cause of a size recompile), and convert_frame warns when a function hits the
recompile limit (it then runs eagerly for new values).
These are internals (see "torch.compile Troubleshooting" in the PyTorch docs for the public log
switches); each is read with a fallback, so a torch that renames one loses that source only.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kiln.diagnose.call_target import quiet_torch
from kiln.diagnose.frames import Place, is_user_file, place_from_summaries, place_from_text, source_line
from kiln.diagnose.torch_logs import graph_break_log, listen

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
    varargs: str | None = None
    """Name of the recompiled function's `*args` parameter (a guard on its length: a varying argument count)."""


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


@dataclass
class Specialization:
    """A dynamic size that user code forced back to one value (torch's `dynamic` log: `Eq(s0, 16)
    [guard added]` at the user's line): the line that makes a changing size recompile."""

    source: str
    """torch's name of the size, e.g. `L['x'].size()[1]`."""
    value: str
    place: Place


class DynamoCapture:
    """What one diagnosis saw; filled while `capture_dynamo()` is active."""

    def __init__(self) -> None:
        self.specializations: list[Specialization] = []
        self.limit_hits: list[dict[str, Any]] = []
        """torch's "hit config.recompile_limit" warnings: that function runs eagerly for new values from then on."""
        self._symbols: dict[str, str] = {}
        self.graphs: list[GraphInfo] = []
        self.breaks: list[RawBreak] = []
        self.recompiles: list[RawRecompile] = []
        self.log_messages: list[str] = []
        self.marks: list[tuple[int, int]] = []

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

    def mark(self) -> None:
        """Call after each call of the compiled model: breaks are then counted per call (per forward)."""
        from torch._dynamo import utils as dynamo_utils

        self.marks.append((len(getattr(dynamo_utils, "graph_break_reasons", [])), len(self.log_messages)))

    def _window(self, index: int, source: int) -> int:
        """Which marked call produced the index-th record of a source (0: graph_break_reasons, 1: log)."""
        return next((w for w, mark in enumerate(self.marks) if mark[source] > index), len(self.marks))

    def collect(self) -> None:
        from torch._dynamo import utils as dynamo_utils

        found: list[tuple[int, RawBreak]] = []
        for i, reason in enumerate(list(getattr(dynamo_utils, "graph_break_reasons", []))):
            text = str(getattr(reason, "reason", reason))
            place = place_from_summaries(getattr(reason, "user_stack", None))
            found.append((self._window(i, 0), RawBreak(text, place, "dynamo")))
        for j, message in enumerate(self.log_messages):
            parsed = _parse_break_log(message)
            if parsed:
                found.append((self._window(j, 1), parsed))
        self.breaks = merge_breaks(found)
        failures = getattr(dynamo_utils, "guard_failures", {})
        for code, reasons in list(failures.items()):
            self.recompiles.extend(_group_recompiles(code, list(reasons)))

    def on_shape_log(self, record: logging.LogRecord) -> None:
        """torch.fx.experimental.symbolic_shapes INFO records: symbols made, and guards that pin one."""
        msg, args = str(record.msg), record.args if isinstance(record.args, tuple) else ()
        if msg.startswith("create_symbol %s = %s for %s") and len(args) >= 3:
            self._symbols[str(args[0])] = str(args[2])
        elif "[guard added]" in msg and len(args) >= 3:
            m = re.fullmatch(r"Eq\((s\d+), (-?\d+)\)", str(args[1]))
            place = place_from_comment("value  # " + str(args[2]))
            if m and m[1] in self._symbols and place is not None:
                self.specializations.append(Specialization(self._symbols[m[1]], m[2], place))

    def on_convert_log(self, record: logging.LogRecord) -> None:
        """torch._dynamo.convert_frame warnings: a recompile limit hit (the frame then runs eagerly)."""
        args = record.args if isinstance(record.args, tuple) else ()
        if str(record.msg).startswith("torch._dynamo hit config.") and len(args) >= 3:
            m = re.match(r"'(\w+)' \((.*):(\d+)\)", str(args[2]))
            self.limit_hits.append({"limit": str(args[0]), "value": args[1], "function": m[1] if m else str(args[2]),
                                    "file": m[2] if m else None, "line": int(m[3]) if m else None})

    @staticmethod
    def recompile_counts() -> dict[int, int]:
        """Recompiles so far per code object (id -> count); snapshots taken between calls tell
        which call caused which recompile (guard_failures is only grouped at `collect`)."""
        from torch._dynamo import utils as dynamo_utils

        failures = getattr(dynamo_utils, "guard_failures", {})
        return {id(code): len(_group_recompiles(code, list(reasons))) for code, reasons in list(failures.items())}


def _headline(reason: str) -> str:
    lines = [ln.strip() for ln in reason.splitlines() if ln.strip() and not ln.strip().startswith("Graph Break")]
    return lines[0] if lines else reason.strip()


def merge_breaks(found: list[tuple[int, RawBreak]]) -> list[RawBreak]:
    """One break per user place, counted per forward.

    Each compile (kiln's own probes and the fullgraph check included) records its breaks again, and
    torch reports a break both in graph_break_reasons and in the log; so a break's count is its
    most occurrences within one call, from one source (graph_break_reasons when it has the break).
    A break with no user frame (its stack is all standard library or torch, e.g. inside
    `logging`) that repeats the reason of a placed break is the same finding: it is folded in."""
    groups: dict[tuple, list[tuple[int, RawBreak]]] = {}
    for window, brk in found:
        key = (brk.place.file, brk.place.line) if brk.place else ("", _headline(brk.reason))
        groups.setdefault(key, []).append((window, brk))
    merged = []
    for entries in groups.values():
        first = next((b for _, b in entries if b.source == "dynamo"), entries[0][1])
        per_call: dict[tuple[str, int], int] = {}
        for window, brk in entries:
            per_call[(brk.source, window)] = per_call.get((brk.source, window), 0) + 1
        source = "dynamo" if any(src == "dynamo" for src, _ in per_call) else entries[0][1].source
        count = max(n for (src, _), n in per_call.items() if src == source)
        skipped = any(b.frame_skipped for _, b in entries)
        merged.append(RawBreak(first.reason, first.place, first.source, skipped, count))
    placed = {_headline(b.reason) for b in merged if b.place is not None}
    return [b for b in merged if b.place is not None or _headline(b.reason) not in placed]


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


_GUARD_COMMENT = re.compile(r"\s#\s(?P<code>.*?)\s+#\s(?P<file>\S+):(?P<line>\d+) in (?P<func>\S+)(?:\s+\(.*\))?\s*$")


def _resolve_file(shown: str, code: Any) -> str:
    """torch shortens the path in a guard's comment (`...mp/proj/model.py`): find the real file."""
    if code is not None and code.co_filename.endswith(shown):
        return code.co_filename
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None) or ""
        if file.endswith(shown):
            return file
    return str(Path(shown).resolve()) if os.path.isfile(shown) else shown


def place_from_comment(text: str, code: Any = None) -> Place | None:
    """The user line torch writes as a comment after a guard or a shape log (`... # code  # file:line in fn`)."""
    m = _GUARD_COMMENT.search(text)
    if not m:
        return None
    file, line = _resolve_file(m["file"], code), int(m["line"])
    return Place(file, line, source_line(file, line) or m["code"].strip(), m["func"]) if is_user_file(file) else None


def guard_place(guard_line: str, stack: str, code: Any) -> Place:
    """Where a failing guard comes from: the innermost user frame of torch's "User stack trace"; else
    the source line torch writes as a comment after the guard (`guard  # code  # file:line in fn`);
    else the first line of the function that recompiled."""
    place = (place_from_text(stack) if stack else None) or place_from_comment(guard_line, code)
    if place is not None:
        return place
    file, line = code.co_filename, code.co_firstlineno
    return Place(file, line, source_line(file, line), code.co_name)


def varargs_name(code: Any) -> str | None:
    """The name of a function's `*args` parameter, if it has one."""
    if not code.co_flags & inspect.CO_VARARGS:
        return None
    return code.co_varnames[code.co_argcount + code.co_kwonlyargcount]


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
        first_line = guard_text.strip().splitlines()[0] if guard_text.strip() else body
        guard = first_line.split("  #")[0].strip()
        place = guard_place(first_line, stack, code)
        out.append(RawRecompile(code.co_name, guard, body.strip(), place, len(event), id(code), ordinal,
                                varargs_name(code)))
    return out


@contextlib.contextmanager
def capture_dynamo() -> Iterator[DynamoCapture]:
    """Start from a clean dynamo state (torch.compiler.reset), record, and reset again on exit so the
    caller's later compiles are not affected by ours."""
    capture = DynamoCapture()
    torch.compiler.reset()
    try:
        with (quiet_torch(), graph_break_log(capture.log_messages),
              listen("torch.fx.experimental.symbolic_shapes", capture.on_shape_log),  # torch's `dynamic` log
              listen("torch._dynamo.convert_frame", capture.on_convert_log)):
            yield capture
            capture.collect()
    finally:
        torch.compiler.reset()
