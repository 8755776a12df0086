"""Swapping a module's class from outside, as FSDP2's `fully_shard` does: the module keeps its
parameters, buffers, state-dict keys and hooks, and only the methods an override class redefines
change. kiln's kernels (decode: kiln.llm.kernels; training's SwiGLU: kiln.train.swiglu) are such
overrides of kiln's plain modules.

An override is a subclass of one plain class (`Block`) that names it as `_plain_class`. A family's
own subclass of that plain class (another norm, another MLP) keeps its code: it gets a class made
once from (override, its class), so the kernel applies by what the module is, not by its exact type.
"""

from __future__ import annotations

from torch import nn

_MADE: dict[tuple[type, type], type] = {}


def plain_class(cls: type) -> type:
    """The class a module of class `cls` had before any override was swapped in."""
    return cls.__dict__.get("_plain_class", cls)


def with_override(plain: type, override: type) -> type:
    """`plain` with `override`'s methods on top: `override` itself when `plain` is the class it
    overrides, else a subclass of both, made once."""
    base = plain_class(override)
    if plain is base:
        return override
    if not issubclass(plain, base):
        raise TypeError(f"{override.__name__} overrides {base.__name__}; {plain.__name__} is not one")
    key = (plain, override)
    if key not in _MADE:
        _MADE[key] = type(f"{override.__name__}[{plain.__name__}]", (override, plain),
                          {"_plain_class": plain, "__module__": override.__module__})
    return _MADE[key]


def swap_class(module: nn.Module, override: type | None) -> bool:
    """Give `module` the class `override` over its plain class (None: its plain class back);
    returns whether its class changed."""
    plain = plain_class(type(module))
    target = plain if override is None else with_override(plain, override)
    if type(module) is target:
        return False
    module.__class__ = target
    return True


def wrapped(module: nn.Module) -> bool:
    """`module`'s class mixes in one of torch's that is not a module (FSDP2's FSDPModule): not a
    plain single-device module."""
    return any(c.__module__.startswith("torch.") and not issubclass(c, nn.Module)
               for c in type(module).__mro__ if c is not object)
