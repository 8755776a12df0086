"""Helpers for the `kiln bench compile` tests: tiny configs and planted compile backends."""

from __future__ import annotations

import pytest
import torch

_TINY_MLP = [
    "model.kwargs.hidden_size=32",
    "model.kwargs.num_layers=2",
    "model.kwargs.num_classes=4",
    "model.kwargs.dropout=0.0",
    "data.batch_size=8",
    "data.synthetic_samples=64",
    "training.device=cpu",
]

_TINY_VIT = [
    "model.kwargs.img_size=16",
    "model.kwargs.patch_size=8",
    "model.kwargs.embed_dim=16",
    "model.kwargs.depth=1",
    "model.kwargs.num_heads=2",
    "model.kwargs.num_classes=5",
    "data.batch_size=4",
    "data.synthetic_samples=16",
    "training.device=cpu",
]

PERTURB = "kiln_test_perturb"
CRASH = "kiln_test_crash"
OOM = "kiln_test_oom"


def _perturb(gm, example_inputs):
    """A miscompiling backend: runs the graph, then scales every floating output by 1.5."""

    def run(*args):
        out = gm(*args)
        scale = lambda t: t * 1.5 if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
        if isinstance(out, (list, tuple)):
            return type(out)(scale(t) for t in out)
        return scale(out)

    return run


def _crash(gm, example_inputs):
    raise RuntimeError("planted backend crash")


def _oom(gm, example_inputs):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB (planted)")


def _register() -> None:
    import torch._dynamo

    known = set(torch._dynamo.list_backends(exclude_tags=()))
    for name, fn in ((PERTURB, _perturb), (CRASH, _crash), (OOM, _oom)):
        if name not in known:
            torch._dynamo.register_backend(fn, name=name)


@pytest.fixture(scope="session")
def planted_backends() -> tuple[str, str, str]:
    _register()
    return PERTURB, CRASH, OOM


@pytest.fixture
def tiny_mlp() -> list[str]:
    """Config overrides for a seed MLP that trains in about a millisecond per step on CPU."""
    return list(_TINY_MLP)


@pytest.fixture
def tiny_vit() -> list[str]:
    """Config overrides shrinking the ViT-B/16 preset to a 1-block, 16x16-pixel ViT."""
    return list(_TINY_VIT)
