"""Shared fixtures of the profile tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def tiny_engine():
    """A kiln Engine over a 2-layer random decoder on CPU (eager)."""
    from kiln.llm.config import config_from_dict
    from kiln.llm.engine import Engine
    from kiln.llm.model import Decoder

    torch.manual_seed(0)
    config = config_from_dict({"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "max_position_embeddings": 64})
    return Engine(Decoder(config).eval())
