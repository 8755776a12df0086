"""The tiny Llama the row tests serve: one per test module (a module's tests share its weights)."""

from __future__ import annotations

import pytest
import torch

from kiln.llm import build_decoder, resolve_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.llm.conftest import write_checkpoint

    directory = write_checkpoint(tmp_path_factory.mktemp("rows") / "llama", "llama3-tied")
    return build_decoder(resolve_model(str(directory)), device="cpu", dtype=torch.float32)
