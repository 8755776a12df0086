"""Data: endless, resumable streams of `(inputs, targets)` batches on the training device.

Sources (`data.source`): `synthetic` (made on the device, learnable), `files` (.npy/.pt pair),
`tokens` (flat .bin token file), `imagefolder` (torchvision) and user `module:function`.
`build_data` is the one entry point; see its docstring for batch layouts, sharding and eval.

The names below load on first use (`__getattr__`): importing the package itself imports no torch,
so its torch-free modules (prepare_request, read by `kiln --help`) stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiln.data.base import DataSource, InputSpecLike
    from kiln.data.build import build_data

__all__ = ["DataSource", "InputSpecLike", "build_data"]


def __getattr__(name: str) -> Any:
    """One of `__all__`, from its module (imported, with torch, on the first use of any)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from kiln.data import base, build

    value = getattr(base if hasattr(base, name) else build, name)
    globals()[name] = value
    return value
