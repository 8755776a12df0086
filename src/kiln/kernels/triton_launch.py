"""What kiln's Triton decode kernels (kiln.kernels.triton_decode, triton_matvec, triton_int4) share
about how they are launched: whether Triton is interpreting on the CPU, whether programmatic
dependent launch is on, the arrival counters of kernels whose last program finishes the work, and
what an autotuner chose and which settings skip it.
A leaf of its own (torch only, no Triton), so the kernel modules import it rather than each other."""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

PDL = os.environ.get("KILN_PDL", "1") != "0"
"""Launch kiln's decode kernels (kiln.kernels.triton_matvec, triton_int4, and kiln.kernels.triton_decode's
fused attention) with programmatic dependent launch where the GPU has it (Hopper and newer): each
call's programs are scheduled while the previous kernel's last ones finish; they read only weights
before waiting for it (`gdc_wait`) and write nothing before. KILN_PDL=0 (or setting this False)
turns it off, for comparisons."""

_ARRIVED: dict[tuple[torch.device, int], Tensor] = {}


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def pdl_enabled(device: torch.device) -> bool:
    return PDL and device.type == "cuda" and not interpreting() and torch.cuda.get_device_capability(device)[0] >= 9


def arrival_counters(device: torch.device, n: int) -> Tensor:
    """`n` zeroed int32 counters for kernels whose last program to arrive finishes the work, kept
    for the process: every call leaves them at zero again, and a CUDA graph that captured a call
    keeps pointing at the same ones. Calls on one stream use them one after another; concurrent
    calls on two streams must not share a device."""
    key = (device, n)
    if key not in _ARRIVED:
        _ARRIVED[key] = torch.zeros(n, dtype=torch.int32, device=device)
    return _ARRIVED[key]


def autotuner_choices(tuner: object, key_length: int, fields: tuple[str, ...]) -> dict[str, list[int]]:
    """What a Triton autotuner chose so far in this process (or read from its disk cache): its key's
    first `key_length` values joined by commas -> the chosen config's `fields` (a kwarg, or
    `num_warps`). Empty for anything that is not an autotuner that ran."""
    def value(config, name: str) -> int:
        return config.num_warps if name == "num_warps" else config.kwargs[name]

    chosen = getattr(tuner, "cache", None) or {}
    return {",".join(str(v) for v in key[:key_length]): [value(config, f) for f in fields]
            for key, config in sorted(chosen.items(), key=str)}


@functools.cache
def device_name(index: int) -> str:
    """torch.cuda.get_device_name, asked once per device (launches look it up)."""
    return torch.cuda.get_device_name(index)


def fixed_setting(pinned: dict, measured: dict[str, dict], device: torch.device, key: tuple,
                  launched: dict | None = None) -> tuple | None:
    """The launch setting for an autotuner `key` that skips the tuner, or None (tune): `pinned[key]`
    (set by a benchmark or test), else the table `measured` holds for this GPU's name (settings
    measured end to end on that GPU, for the shapes that were measured). A setting found is also
    kept in `launched[key]`, so what a process launched can be reported beside the tuner's picks."""
    if key in pinned:
        found = pinned[key]
    elif device.type != "cuda":
        return None
    else:
        found = measured.get(device_name(device.index if device.index is not None else torch.cuda.current_device()),
                             {}).get(key)
    if found is not None and launched is not None:
        launched[key] = found
    return found


def settings_launched(tuner: object, key_length: int, fields: tuple[str, ...], launched: dict) -> dict[str, list[int]]:
    """`autotuner_choices` with the fixed settings launched (`fixed_setting`'s `launched`) beside them,
    in the same form: 'key values' -> the setting's values."""
    return {**autotuner_choices(tuner, key_length, fields),
            **{",".join(str(v) for v in key): list(setting) for key, setting in sorted(launched.items(), key=str)}}
