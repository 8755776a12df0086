"""DistributedDataParallel with kiln's options and gradient-compression hooks."""

from __future__ import annotations

import logging
import warnings

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from kiln.config.schema import DistributedConfig
from kiln.distributed.sync_timing import SyncTimer

log = logging.getLogger("kiln.distributed")


def apply_ddp(model: torch.nn.Module, cfg: DistributedConfig, device: torch.device, grad_accum_steps: int = 1,
              sync_timer: SyncTimer | None = None) -> DDP:
    """Wrap for DDP. static_graph + gradient_as_bucket_view are the fast defaults for models whose
    used parameters never change; find_unused_parameters costs a graph walk every step. A
    `sync_timer` wraps the communication hook to time the wait in the gradient all-reduce."""
    static_graph = cfg.ddp_static_graph
    if static_graph and grad_accum_steps > 1:
        # static_graph + no_sync() trips an internal assert in the reducer on the first backward and,
        # patched past that, silently stops all-reducing (pytorch/pytorch#143580, PR #187732).
        log.warning("DDP: static_graph is off because gradient accumulation uses no_sync() (pytorch#143580)")
        static_graph = False
    with warnings.catch_warnings():
        # torch 2.13 deprecates broadcast_buffers for forward_sync_buffers, but its own message says
        # to keep broadcast_buffers=False until rank-local buffers can also skip the sync at init.
        warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
        ddp = DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=cfg.ddp_bucket_cap_mb,
            broadcast_buffers=cfg.ddp_broadcast_buffers,
            find_unused_parameters=cfg.ddp_find_unused_parameters,
            gradient_as_bucket_view=cfg.ddp_gradient_as_bucket_view,
            static_graph=static_graph,
        )
    if cfg.ddp_comm_hook != "none" or sync_timer is not None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook,
                "none": default_hooks.allreduce_hook}[cfg.ddp_comm_hook]
        ddp.register_comm_hook(state=None, hook=sync_timer.wrap(hook) if sync_timer is not None else hook)
    return ddp
