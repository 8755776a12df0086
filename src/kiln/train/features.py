"""The training features applied to a model from outside, checked and resolved before any work.

`resolve_features` turns the config's `model.attention`, `training.ce_kernel`,
`training.swiglu_kernel`, `training.activation_checkpointing` and `precision.float8` into what
this run will do (or a ConfigError naming the key, exit 2, before anything is written). The
resolved `Features` go to the log and to summary.json under `features`; kiln.train.assemble
applies the SwiGLU kernel, float8 and checkpointing, kiln.train.losses the cross-entropy kernel,
and the trainer runs the loop under the attention kernel.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from kiln.config.schema import Config
from kiln.errors import ConfigError
from kiln.precision import PrecisionPolicy
from kiln.train.attention import choose_attention
from kiln.train.cross_entropy import resolve_ce_kernel
from kiln.train.float8 import check_float8
from kiln.train.swiglu import resolve_swiglu_kernel


@dataclass(frozen=True)
class Features:
    """What this run applies to the model from outside, resolved (no `auto` left but in `attention`'s
    request)."""

    attention: dict[str, Any]
    """kiln.train.attention.choose_attention's answer: `requested`, `kernel` (None: chosen per call), `expand_kv`."""
    ce_kernel: str
    swiglu_kernel: str
    activation_checkpointing: str
    float8: str

    def as_dict(self) -> dict[str, Any]:
        """For summary.json (`features`)."""
        return dataclasses.asdict(self)


def resolve_features(cfg: Config, built, model: torch.nn.Module, policy: PrecisionPolicy, device: torch.device,
                     train_data, checkpointing: str) -> Features:
    """The features of this run. `built`: the BuiltModel; `model`: its module on the device;
    `train_data`: the DataSource; `checkpointing`: `training.activation_checkpointing` as the memory
    plan resolved it (kiln.train.gpu_plan.planned_checkpointing)."""
    check_float8(cfg.precision.float8, device, cfg.precision.policy)
    ac = checkpointing
    if ac != "none" and not built.blocks:
        raise ConfigError("training.activation_checkpointing",
                          f"{cfg.model.name} has no repeated blocks to checkpoint one by one", ("none",))
    if cfg.precision.float8 != "none" and not built.blocks:
        raise ConfigError("precision.float8", f"{cfg.model.name} has no repeated blocks whose linear layers "
                          "could run in float8", ("none",))
    ce_kernel = resolve_ce_kernel(cfg.training.ce_kernel, built.hidden_states and built.task == "causal_lm")
    swiglu_kernel = resolve_swiglu_kernel(cfg.training.swiglu_kernel, model, device)
    tokens, samples = getattr(train_data, "tokens_per_batch", None), getattr(train_data, "samples_per_batch", 0)
    if tokens and samples:
        dtype = policy.autocast_dtype or policy.param_dtype
        attention = choose_attention(model, cfg.model.attention, device=device, dtype=dtype, seq_len=tokens // samples)
    else:
        attention = {"requested": cfg.model.attention, "kernel": None, "expand_kv": False}
    return Features(attention=attention, ce_kernel=ce_kernel, swiglu_kernel=swiglu_kernel,
                    activation_checkpointing=ac, float8=cfg.precision.float8)


def describe_features(features: Features) -> str:
    """One log line."""
    att = features.attention
    kernel = att["kernel"] or "chosen per call"
    if att["expand_kv"]:
        kernel += ", key/value heads repeated"
    return (f"attention: {kernel} (model.attention={att['requested']}); cross-entropy: {features.ce_kernel}; "
            f"SwiGLU: {features.swiglu_kernel}; "
            f"activation checkpointing: {features.activation_checkpointing}; float8: {features.float8}")
