"""This process's place in the job (from torchrun's environment) and the process group.

Model code stays single-device; everything rank-aware goes through `DistEnv`, so a one-process
run is simply `DistEnv(rank=0, world_size=1)` with no process group.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kiln.errors import ConfigError


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @classmethod
    def from_env(cls) -> DistEnv:
        """Read torchrun's variables; absent ones mean a plain one-process run."""
        try:
            return cls(
                rank=int(os.environ.get("RANK", 0)),
                local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                world_size=int(os.environ.get("WORLD_SIZE", 1)),
                local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
            )
        except ValueError as exc:
            raise ConfigError("RANK/WORLD_SIZE", f"bad torchrun environment: {exc}") from None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def launched(self) -> bool:
        """True under torchrun (even with one process): a process group is wanted."""
        return "RANK" in os.environ and "MASTER_ADDR" in os.environ


def device_for(env: DistEnv, spec: str) -> torch.device:
    """One GPU per process: local rank r takes cuda:r; CPU ranks share the CPU."""
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("training.device", f"{spec} asked for, but this torch sees no CUDA device", ("auto", "cpu"))
    if env.local_rank >= torch.cuda.device_count():
        raise ConfigError(
            "--nproc-per-node",
            f"local rank {env.local_rank} has no GPU: {torch.cuda.device_count()} visible",
        )
    torch.cuda.set_device(env.local_rank)
    return torch.device("cuda", env.local_rank)


def backend_for(device: torch.device, choice: str) -> str:
    if choice != "auto":
        if choice == "nccl" and device.type != "cuda":
            raise ConfigError("distributed.backend", "nccl needs CUDA devices; use gloo on CPU", ("auto", "gloo"))
        return choice
    return "nccl" if device.type == "cuda" else "gloo"


def enable_flight_recorder(run_dir) -> None:
    """NCCL's flight recorder keeps the last collectives of each rank and, on a timeout, dumps
    them to `run_dir/flight_recorder/rank_<r>` (PyTorch "Flight Recorder" docs); read the dumps
    with `python -m torch.distributed.flight_recorder.fr_trace`. Must be set before the group
    exists; a user's own settings win."""
    from pathlib import Path

    folder = Path(run_dir) / "flight_recorder"
    folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(folder / "rank_"))


def init_process_group(env: DistEnv, device: torch.device, backend: str, timeout_s: float, run_dir=None) -> None:
    """Create the default group once; a collective that waits longer than `timeout_s` fails
    instead of hanging (NCCL needs async error handling for that, on by default in torch >= 2.2)."""
    if dist.is_initialized():
        return
    if backend == "nccl" and run_dir is not None:
        enable_flight_recorder(run_dir)
    timeout = datetime.timedelta(seconds=timeout_s)
    kwargs = {"backend": backend, "timeout": timeout}
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is not None and "MASTER_ADDR" in os.environ:
        # Give each elastic attempt its own key space in the rendezvous store: after a restart,
        # gloo ranks were seen reading the dead attempt's peer addresses and failing to connect
        # ("Connection refused" in connectFullMesh), which turned one crash into a failed job.
        store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
        kwargs.update(store=dist.PrefixStore(f"kiln/attempt_{attempt}", store), rank=rank, world_size=world_size)
    if backend == "nccl":
        # Binding the device at init lets NCCL create its communicator eagerly (torch >= 2.3).
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    if not active():
        return value
    out = value.detach().clone().float()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / dist.get_world_size()


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    if not active():
        return value
    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def gather_floats(values: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's `values` (same length on each rank), on every rank: one small all_gather."""
    local = torch.tensor(values, dtype=torch.float64, device=device)
    if not active():
        return [values]
    out = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(out, local)
    return [t.tolist() for t in out]


def barrier() -> None:
    if active():
        dist.barrier()
