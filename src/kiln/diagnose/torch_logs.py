"""Listening to torch's log artifacts without printing them: the `graph_breaks` artifact (breaks, also
those after which dynamo skipped the frame), the `dynamic` log (symbols and the guards that pin a
dynamic size) and convert_frame's warnings (a recompile limit hit). Handlers and levels are
restored on exit.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator


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
def graph_break_log(sink: list[str]) -> Iterator[None]:
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


class _CallbackHandler(logging.Handler):
    def __init__(self, callback: Callable[[logging.LogRecord], None]) -> None:
        super().__init__(logging.INFO)
        self.callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.callback(record)
        except Exception:  # a log format kiln does not know must not break the diagnosis
            return


@contextlib.contextmanager
def listen(name: str, callback: Callable[[logging.LogRecord], None]) -> Iterator[None]:
    """Send a torch logger's INFO+ records to `callback` only (torch's own handler would print them)."""
    log = logging.getLogger(name)
    saved = (log.level, log.propagate, list(log.handlers))
    log.setLevel(logging.INFO)
    log.propagate = False
    log.handlers = [_CallbackHandler(callback)]
    try:
        yield
    finally:
        log.setLevel(saved[0])
        log.propagate = saved[1]
        log.handlers = saved[2]
