"""Where in the user's code something happened: pick the last frame that is not torch's own.

torch reports stacks as `traceback.FrameSummary` lists (graph-break reasons), as formatted text
(FX node `stack_trace` metadata, log messages) or inside exceptions. All three go through here so
every report names the same kind of place: the user's file, line and source line.
"""

from __future__ import annotations

import linecache
import os
import re
import sysconfig
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_KILN_DIAGNOSE_DIR = str(Path(__file__).resolve().parent)
_STDLIB_DIRS = tuple(
    str(Path(p).resolve()) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]} if p
)
_FRAME_TEXT = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<name>\S+))?')


@dataclass(frozen=True)
class Place:
    file: str
    line: int
    code: str
    function: str = ""

    def as_dict(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "code": self.code}


def is_user_file(filename: str) -> bool:
    """False for torch, inductor's generated code, the standard library and kiln's own diagnosis code;
    libraries such as timm or transformers count as user code, since the break is in their source
    and the fix starts there."""
    if not filename or filename.startswith("<"):
        return False
    try:
        path = str(Path(filename).resolve())
    except OSError:
        return True
    if path.startswith((_TORCH_DIR + os.sep, _KILN_DIAGNOSE_DIR + os.sep)) or _is_generated(path):
        return False
    # site-packages sits under the stdlib dir on most layouts: it is user code, not stdlib.
    if "site-packages" in path or "dist-packages" in path:
        return True
    return not path.startswith(tuple(d + os.sep for d in _STDLIB_DIRS))


def _is_generated(path: str) -> bool:
    """Code inductor wrote (its cache dir, `torchinductor_<user>` by default or TORCHINDUCTOR_CACHE_DIR)."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache and path.startswith(str(Path(cache).resolve()) + os.sep):
        return True
    return any(part.startswith("torchinductor_") for part in Path(path).parts)


def source_line(file: str, line: int) -> str:
    return linecache.getline(file, line).strip()


def last_user_place(frames: list[tuple[str, int, str]]) -> Place | None:
    """frames: (file, line, function) innermost last. The innermost frame in user code."""
    for file, line, name in reversed(frames):
        if is_user_file(file):
            return Place(file, int(line), source_line(file, int(line)), name)
    return None


def place_from_summaries(stack: list[traceback.FrameSummary] | None) -> Place | None:
    if not stack:
        return None
    return last_user_place([(f.filename, f.lineno or 0, f.name) for f in stack])


def frames_from_text(text: str) -> list[tuple[str, int, str]]:
    """`File "x.py", line 3, in f` occurrences, in order (stack traces, log messages)."""
    return [(m["file"], int(m["line"]), m["name"] or "") for m in _FRAME_TEXT.finditer(text or "")]


def place_from_text(text: str) -> Place | None:
    return last_user_place(frames_from_text(text))


def place_from_exception(exc: BaseException) -> Place | None:
    """The user frame of an exception from torch.compile: dynamo's real_stack (the user code it was
    tracing) when present, else the frames quoted in the message, else the Python traceback."""
    for err in (exc, exc.__cause__, exc.__context__):
        if err is None:
            continue
        place = place_from_summaries(getattr(err, "real_stack", None))
        if place:
            return place
        place = place_from_text(str(err))
        if place:
            return place
    tb = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    return place_from_summaries(list(tb))


def function_span(file: str, line: int) -> tuple[int, int] | None:
    """(first, last) line of the innermost function in `file` that contains `line`."""
    import ast

    try:
        tree = ast.parse(Path(file).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= (node.end_lineno or 0):
            if best is None or node.lineno >= best[0]:
                best = (node.lineno, node.end_lineno or node.lineno)
    return best
