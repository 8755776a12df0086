"""The plain transformers loop of `kiln bench train-llm`: what a user writes, importing no kiln."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch

from kiln.bench.peers.plain import plain_loop as plain
from kiln.models.hf import PRESETS


def test_plain_loop_imports_no_kiln_code():
    tree = ast.parse(inspect.getsource(plain))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.split(".")[0] == "kiln"]


def test_warmup_then_constant():
    assert [plain.lr_factor(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_one_step_is_the_models_own_loss_then_an_adamw_update(tmp_path):
    transformers = pytest.importorskip("transformers")
    weights = plain.write_initial_weights(dict(PRESETS["llama-tiny"]), tmp_path / "init", seed=0, device="cpu")
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32)
    x = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(input_ids=x, labels=x).loss
    hyper = plain.Hyper(lr=1e-2, warmup_steps=2)
    loop = plain.PlainLoop(weights, torch.device("cpu"), hyper, compile=False, autocast_dtype=None)
    before = loop.model.lm_head.weight.detach().clone()
    loss = loop.step(x)
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    assert loop.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)  # second warm-up step: 2/2
    assert not torch.equal(before, loop.model.lm_head.weight)
    assert loop.config["labels"].startswith("input_ids") and loop.num_params() == sum(
        p.numel() for p in reference.parameters())
