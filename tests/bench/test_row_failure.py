"""kiln.bench.row_failure: a failed row's status and one-line reason."""

from __future__ import annotations

import torch

from kiln.bench.row_failure import failure


def test_failures_become_one_line_statuses():
    try:
        try:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.\nTried to allocate 2 GiB")
        except Exception as inner:
            raise RuntimeError("backend failed") from inner
    except Exception as exc:
        status, reason = failure(exc)
    assert status == "oom" and "OutOfMemoryError: CUDA out of memory." in reason and "\n" not in reason
    status, reason = failure(ValueError("bad shape\nmore detail"))
    assert (status, reason) == ("error", "ValueError: bad shape")
