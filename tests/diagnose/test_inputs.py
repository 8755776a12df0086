"""--input SPEC and --vary parsing."""

from __future__ import annotations

import pytest
import torch

from kiln.diagnose.inputs import parse_input_spec, parse_input_specs
from kiln.diagnose.vary import make_variants, parse_vary
from kiln.errors import ConfigError


def test_input_specs():
    x = parse_input_spec("8x3x4x4")
    assert x.shape == (8, 3, 4, 4) and x.dtype == torch.float32
    assert parse_input_spec("float16:4x16").dtype == torch.float16
    tokens = parse_input_spec("int64[0,512):2x32")
    assert tokens.dtype == torch.int64 and tokens.min() >= 0 and tokens.max() < 512
    assert parse_input_spec("float=0.5") == 0.5 and parse_input_spec("int=3") == 3
    a, b = parse_input_specs(["2x3", "2x3"])
    assert not torch.equal(a, b)  # distinct seeds per input
    assert torch.equal(parse_input_spec("2x3"), parse_input_spec("2x3"))  # deterministic


@pytest.mark.parametrize("bad", ["", "4xx3", "0x3", "float32:", "int64[5,1):2", "int32[0.5,2):2", "int=1.5", "cfloat:2"])
def test_bad_input_specs_name_the_flag(bad):
    with pytest.raises(ConfigError) as err:
        parse_input_spec(bad)
    assert err.value.key == "--input"


def test_vary_parsing_and_variants():
    assert parse_vary(["batch=4,8,scalars", "dim1"]) == [("batch", [4, 8]), ("scalars", None), ("dim1", None)]
    with pytest.raises(ConfigError):
        parse_vary(["scalars=3"])
    base = (torch.zeros(2, 5, dtype=torch.int64), 0.5)
    variants, notes = make_variants(base, parse_vary(["batch", "dim1=7", "scalars", "dtype"]))
    labels = [v.label for v in variants]
    assert labels[:3] == ["batch=4", "batch=6", "dim1=7"]
    assert variants[2].inputs[0].shape == (2, 7)
    assert any(label.startswith("scalars=") for label in labels) and "dtype=int32" in labels
    assert notes == []
