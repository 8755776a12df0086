"""World size 2 -> 1: two gloo processes save (DDP; FSDP2 shards with async save), one loads."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kiln.checkpoint import AppState, Checkpointer
from kiln.checkpoint.export import load_model_weights
from kiln.config.schema import CheckpointConfig

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def ranks():
    """The rank-side module, importable by its plain name in the spawned processes too: they
    unpickle `worker` by module name and inherit this process's sys.path (pytest's importlib
    mode would otherwise give it a package name that only this process can resolve)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(HERE))
        yield importlib.import_module("ckpt_dist_worker")


@pytest.fixture(scope="module")
def saved_runs(ranks, tmp_path_factory) -> tuple[Path, list[str]]:
    """One spawn for both strategies: starting two Python processes with torch is the slow part."""
    modes = ["ddp", "fsdp"] if ranks.fsdp_available() else ["ddp"]
    root = tmp_path_factory.mktemp("dist")
    mp.spawn(ranks.worker, args=(2, str(root / "store"), str(root), modes), nprocs=2, join=True)
    return root, modes


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_world_size_2_to_1(ranks, saved_runs, mode: str) -> None:
    root, modes = saved_runs
    if mode not in modes:
        pytest.skip("this torch has no FSDP2 (torch.distributed.fsdp.fully_shard)")
    run_dir = root / mode
    reference = torch.load(run_dir / "reference.pt", weights_only=True)

    model = ranks.make_model(seed=5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = ranks.Position(0, 0)
    app = AppState(model, optimizer, data=data, rank=0, world_size=1)
    ck = Checkpointer(run_dir, CheckpointConfig(), rank=0, world_size=1)
    report = ck.load(ck.resolve_resume("auto"), app)

    assert report.saved_world_size == 2
    assert "resharded from world size 2 to 1" in report.notes
    for key, value in model.state_dict().items():
        assert torch.equal(value, reference["model"][key]), key
    state = optimizer.state_dict()["state"]
    for i, (name, _) in enumerate(model.named_parameters()):  # full (unsharded) moments, as saved
        assert torch.equal(state[i]["exp_avg"], reference["optim"][name]["exp_avg"]), name
        assert torch.equal(state[i]["exp_avg_sq"], reference["optim"][name]["exp_avg_sq"]), name
    assert app.progress["step"] == 3 and app.progress["samples_seen"] == 24
    assert torch.equal(torch.get_rng_state(), reference["rng"])  # rank 0's stream continues here
    # Rank 0 was 3 batches into epoch 1 with 2 ranks: the same samples are 6 batches of one rank.
    assert data.state == {"epoch": 1, "index": 6}

    # Export consolidates the shards without the model code or a process group.
    weights = load_model_weights(report.path)
    assert set(weights) == set(reference["model"])
    assert all(torch.equal(weights[k], reference["model"][k]) for k in weights)
