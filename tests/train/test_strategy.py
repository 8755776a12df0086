"""Which strategy a run applies: one process is `none`; a 1-rank torchrun job that names ddp/fsdp
applies it (kiln bench scale's 1-rank reference points); auto picks by training-state size."""

from __future__ import annotations

import pytest
import torch

from kiln.config import load_config
from kiln.errors import ConfigError
from kiln.train.strategy import resolve_strategy

CPU = torch.device("cpu")


@pytest.mark.parametrize("chosen", ["ddp", "fsdp"])
def test_one_rank_applies_a_named_strategy_only_under_torchrun(chosen):
    cfg = load_config(None, [f"distributed.strategy={chosen}"])
    assert resolve_strategy(cfg, 1, 1000, 4, CPU)[0] == "none"
    strategy, reason = resolve_strategy(cfg, 1, 1000, 4, CPU, launched=True)
    assert strategy == chosen and "one rank" in reason


def test_auto_and_none_on_one_rank_stay_unwrapped():
    for chosen in ("auto", "none"):
        cfg = load_config(None, [f"distributed.strategy={chosen}"])
        assert resolve_strategy(cfg, 1, 1000, 4, CPU, launched=True)[0] == "none"


def test_none_with_several_ranks_is_bad_input():
    with pytest.raises(ConfigError) as err:
        resolve_strategy(load_config(None, ["distributed.strategy=none"]), 2, 1000, 4, CPU)
    assert err.value.key == "distributed.strategy"
