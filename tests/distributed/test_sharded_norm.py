"""FSDP2 gradient norm and clipping on local shards (kiln.distributed.sharded_norm) agree with
torch's DTensor path, on two gloo ranks; other layouts go to torch unchanged."""

from __future__ import annotations

import pytest
import torch

from kiln.distributed.sharded_norm import clip_grad_norm, total_norm


def test_sharded_norm_and_clipping_match_torch_on_two_ranks(run_ranks, tmp_path):
    r = run_ranks("sharded_norm_worker.py", tmp_path / "report.json")
    assert r["plain"] == "Tensor"  # a reduced plain tensor, not a DTensor
    assert r["norm"] == pytest.approx(r["torch_norm"], rel=1e-5)
    assert r["clip_returned"] == pytest.approx(r["torch_norm"], rel=1e-5) and r["norm"] > 0.5  # it did clip
    assert r["max_grad_diff"] < 1e-6
    assert r["paths"] == {"locals_are_to_local": True, "replicated_alone": True, "replicated_among_sharded": True}


def test_plain_gradients_go_to_torch():
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    layer(torch.randn(2, 4)).sum().backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    expected = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))
    assert torch.allclose(total_norm(grads), expected)
    norm = clip_grad_norm(list(layer.parameters()), 0.1)
    assert torch.allclose(norm, expected)
    clipped = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in layer.parameters()]))
    assert clipped == pytest.approx(0.1, rel=1e-4)


def test_hsdp_norm_sums_over_the_shard_groups_only(run_ranks, tmp_path):
    r = run_ranks("hsdp_norm_worker.py", tmp_path / "report.json", nproc=4)
    assert r["placements"] == ["Replicate", "Shard"] and r["local_path"] and r["groups"] == 1
    assert r["norm"] == pytest.approx(r["torch_norm"], rel=1e-5)
    assert r["clip_returned"] == pytest.approx(r["torch_norm"], rel=1e-5) and r["norm"] > 0.5
    assert r["max_grad_diff"] < 1e-6
