"""Data: endless, resumable streams of `(inputs, targets)` batches on the training device.

Sources (`data.source`): `synthetic` (made on the device, learnable), `files` (.npy/.pt pair),
`tokens` (flat .bin token file), `imagefolder` (torchvision) and user `module:function`.
`build_data` is the one entry point; see its docstring for batch layouts, sharding and eval.
"""

from __future__ import annotations

from kiln.data.base import DataSource, InputSpecLike
from kiln.data.build import build_data

__all__ = ["DataSource", "InputSpecLike", "build_data"]
