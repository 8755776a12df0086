"""Precision policies: fp32 | bf16-mixed | fp16-mixed (with GradScaler) | bf16-true | bf16-master, and TF32.

A policy is resolved once per run; the step function asks it for an autocast context and, for
fp16, a GradScaler. fp16 without loss scaling underflows small gradients to zero, which is why
`fp16-mixed` always comes with a scaler and bf16 (fp32's exponent range) never needs one.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from kiln.cpu.topology import read_topology
from kiln.errors import ConfigError


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str
    autocast_dtype: torch.dtype | None
    """dtype of the autocast region around forward + loss, or None for no autocast."""
    param_dtype: torch.dtype
    """dtype the model's floating-point parameters are kept in."""
    needs_scaler: bool
    """fp16 gradients need dynamic loss scaling."""
    master_weights: bool = False
    """The optimizer keeps fp32 master weights and moments of the low-precision parameters
    (kiln.train.master_adamw): `bf16-master`."""

_POLICIES = {
    "fp32": PrecisionPolicy("fp32", None, torch.float32, False),
    "bf16-mixed": PrecisionPolicy("bf16-mixed", torch.bfloat16, torch.float32, False),
    "fp16-mixed": PrecisionPolicy("fp16-mixed", torch.float16, torch.float32, True),
    "bf16-true": PrecisionPolicy("bf16-true", None, torch.bfloat16, False),
    # bf16 weights and gradients in the model, fp32 masters in the optimizer: the matmuls see the
    # same bf16 weights as under bf16-mixed without autocast's per-step casts.
    "bf16-master": PrecisionPolicy("bf16-master", None, torch.bfloat16, False, master_weights=True),
}


def resolve_precision(name: str, device: torch.device) -> PrecisionPolicy:
    if name not in _POLICIES:
        raise ConfigError("precision.policy", f"unknown value {name!r}", tuple(_POLICIES))
    policy = _POLICIES[name]
    if device.type == "cuda" and "bf16" in name and not torch.cuda.is_bf16_supported():
        raise ConfigError("precision.policy", f"{name} needs a GPU with bfloat16 support (Ampere or newer)",
                          ("fp32", "fp16-mixed"))
    if device.type == "cpu" and "bf16" in name:
        _warn_emulated_bf16()
    return policy


def cpu_bf16_native() -> bool:
    """The CPU runs bf16 matmuls natively (AMX, AVX512-BF16, Arm BF16): bf16 autocast pays there."""
    return read_topology().native_bf16


@functools.cache
def _warn_emulated_bf16() -> None:
    # Autocast to bf16 works on every CPU, but without native bf16 instructions oneDNN converts
    # to fp32 and back around each matmul: slower than fp32, and less precise.
    if not cpu_bf16_native():
        logging.getLogger("kiln.precision").warning(
            "precision: this CPU has no native bf16 (AMX, AVX512-BF16): bf16 is emulated and slower than fp32 here; "
            "precision.policy=fp32 is the fast choice on it")


def apply_precision(model: torch.nn.Module, policy: PrecisionPolicy) -> torch.nn.Module:
    """Cast parameters for `bf16-true` and `bf16-master` (whose optimizer keeps fp32 masters);
    mixed policies keep fp32 weights."""
    if policy.param_dtype != torch.float32:
        model.to(dtype=policy.param_dtype)
    return model


def autocast(policy: PrecisionPolicy, device: torch.device, cache: bool = True) -> contextlib.AbstractContextManager:
    """`cache=False` for code captured into a CUDA graph: autocast's cast cache must be off there
    (PyTorch CUDA Graphs notes, "Usage with torch.cuda.amp")."""
    if policy.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=policy.autocast_dtype, cache_enabled=cache)


def with_precision(fn: Callable, policy: PrecisionPolicy, device: torch.device, *, cache: bool = True) -> Callable:
    """Wrap `fn(inputs, targets)` so it runs under the policy: floating inputs are cast to the
    parameter dtype (bf16-true, bf16-master) and the call runs inside autocast (mixed policies)."""
    cast = policy.param_dtype != torch.float32

    def run(inputs, targets):
        if cast and inputs.is_floating_point():
            inputs = inputs.to(policy.param_dtype)
        with autocast(policy, device, cache):
            return fn(inputs, targets)

    return run


def make_grad_scaler(policy: PrecisionPolicy, device: torch.device) -> torch.amp.GradScaler | None:
    if not policy.needs_scaler:
        return None
    return torch.amp.GradScaler(device.type)


@contextlib.contextmanager
def tf32_enabled(enabled: bool) -> Iterator[None]:
    """Allow (or forbid) TF32 for fp32 matmuls and convolutions, restoring the previous setting.

    `set_float32_matmul_precision` is the stable switch across torch 2.6 .. 2.13; cuDNN's flag
    has no such wrapper, and newer torch warns on the old attribute, hence the filter.
    """
    old_matmul = torch.get_float32_matmul_precision()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old_cudnn = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = enabled
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old_matmul)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.backends.cudnn.allow_tf32 = old_cudnn
