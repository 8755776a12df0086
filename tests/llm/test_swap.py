"""kiln.llm.swap: a kernel's override swaps in over a family's own subclass without losing its code,
swaps back to that subclass, and a class torch mixed in (FSDP2) marks a module as not plain."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kiln.llm.swap import plain_class, swap_class, with_override, wrapped


class Plain(nn.Linear):
    pass


class Doubled(Plain):
    """An override: Plain's forward, times two."""

    _plain_class = Plain

    def forward(self, x):
        return super().forward(x) * 2


class FamilyPlain(Plain):
    def extra(self) -> str:
        return "family"


def test_an_override_swaps_in_over_the_plain_class_and_back():
    m = Plain(3, 2)
    x = torch.randn(4, 3)
    ref = m(x)
    assert swap_class(m, Doubled) and type(m) is Doubled and m(x).equal(ref * 2)
    assert not swap_class(m, Doubled)
    assert swap_class(m, None) and type(m) is Plain and m(x).equal(ref)


def test_a_family_subclass_keeps_its_code_under_an_override():
    m = FamilyPlain(3, 2)
    keys = set(m.state_dict())
    x = torch.randn(4, 3)
    ref = m(x)
    assert swap_class(m, Doubled)
    assert isinstance(m, Doubled) and isinstance(m, FamilyPlain) and m.extra() == "family"
    assert m(x).equal(ref * 2) and set(m.state_dict()) == keys
    assert with_override(FamilyPlain, Doubled) is type(m)  # made once
    assert plain_class(type(m)) is FamilyPlain
    assert swap_class(m, None) and type(m) is FamilyPlain


def test_an_override_of_another_class_is_refused():
    with pytest.raises(TypeError, match="Doubled overrides Plain"):
        swap_class(nn.Linear(3, 2), Doubled)


def test_a_class_torch_mixed_in_is_not_plain():
    mixin = type("FSDPModule", (), {"__module__": "torch.distributed.fsdp._fully_shard._fully_shard"})
    fsdp_plain = type("FSDPPlain", (mixin, Plain), {})
    assert not wrapped(Plain(3, 2)) and not wrapped(FamilyPlain(3, 2))
    assert wrapped(fsdp_plain(3, 2))
