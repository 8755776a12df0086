"""A bench row that failed: its status (`oom` or `error`) and a one-line reason.

Every bench keeps going when one row fails; the row records why in one line, taken from the root
of the exception chain (where the real cause is), prefixed by the exception that surfaced.
"""

from __future__ import annotations

import torch


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def failure(exc: BaseException) -> tuple[str, str]:
    """(status, one-line reason) for an exception raised while running a row."""
    chain = _chain(exc)
    oom = any(isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower() for e in chain)
    root = chain[-1]
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    text = f"{type(root).__name__}: {lines[0] if lines else ''}".strip()
    if root is not exc:
        text = f"{type(exc).__name__}: {text}"
    return ("oom" if oom else "error"), text[:300]

