"""The rank side of test_ckpt_distributed, in a module of its own: each spawned process imports
it, so it imports only what a rank needs (no pytest, no data stack)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from kiln.checkpoint import AppState, Checkpointer
from kiln.config.schema import CheckpointConfig


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 3)
    )


class Position:
    """A data source's position (what AppState stores per rank)."""

    def __init__(self, epoch: int, index: int) -> None:
        self.state = {"epoch": epoch, "index": index}

    def state_dict(self) -> dict[str, int]:
        return dict(self.state)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = dict(state)


def fsdp_available() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


def train_and_save(rank: int, world: int, run_dir: Path, mode: str, ck: Checkpointer) -> None:
    """3 steps of DDP (sync save) or FSDP2 (sharded, async save), then a checkpoint through `ck`
    and, from rank 0, the full reference state written with torch.save."""
    model = make_model(seed=0)  # same init on every rank, as DDP/FSDP require
    if mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        fully_shard(model[0], mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(100 + rank)  # each rank its own batches and dropout
    for _ in range(3):
        model(torch.randn(4, 6)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    app = AppState(model, optimizer, data=Position(1, 3 + rank), rank=rank, world_size=world)
    app.progress.update(step=3, samples_seen=24)
    rng_at_save = torch.get_rng_state()
    ck.save(3, app)
    if ck.cfg.async_save:  # DCP's collectives in their own gloo group, not the training's
        assert ck.distributed and ck._async_group is not None and ck._async_group is not dist.group.WORLD
        assert dist.get_backend(ck._async_group) == "gloo"
    ck.wait()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    full_model, full_optim = get_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if rank == 0:
        torch.save({"model": full_model, "optim": full_optim["state"], "rng": rng_at_save},
                   run_dir / "reference.pt")
    dist.barrier()


def worker(rank: int, world: int, store_path: str, root: str, modes: list[str]) -> None:
    torch.set_num_threads(1)
    # Made before the process group exists, as `kiln train` makes its Checkpointer: an async save
    # must still find the group (and make its own) when it runs.
    made = {mode: Checkpointer(Path(root) / mode, CheckpointConfig(async_save=mode == "fsdp"), rank=rank,
                               world_size=world) for mode in modes}
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        for mode in modes:
            run_dir = Path(root) / mode
            if rank == 0:
                run_dir.mkdir(parents=True, exist_ok=True)
            dist.barrier()
            train_and_save(rank, world, run_dir, mode, made[mode])
    finally:
        dist.destroy_process_group()
