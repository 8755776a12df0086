"""The rank side of test_meta_init: kiln's decoder under FSDP2 through the trainer's own build (on the
meta device, sharded, then each rank's shards filled), one forward (FSDP2's lazy init); rank 0 saves the
gathered initial weights and reports whether the meta build ran and the FLOPs the loop counted."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from gloo_ranks import finish


class _Sinks:
    def log(self, record: dict) -> None:
        pass

    def waiting(self, message: str) -> None:
        pass


def main(out: str) -> None:
    from kiln.config import load_config
    from kiln.train.trainer import Trainer

    dist.init_process_group("gloo")
    overrides = json.loads(os.environ["META_INIT_OVERRIDES"])  # set by the test
    cfg = load_config(None, overrides)
    trainer = Trainer(cfg, Path(out).parent / "run")
    meta = trainer.parts.built.initial_values is not None and all(p.is_meta for p in trainer.parts.model.parameters())
    trainer.loop.prepare(_Sinks())
    with torch.no_grad():  # FSDP2's lazy init (first forward) re-points and pads the local shards: values kept
        trainer.loop.model(torch.zeros((1, 8), dtype=torch.long))
    weights = {}
    for name, param in trainer.loop.model.named_parameters():
        weights[name] = param.full_tensor() if hasattr(param, "full_tensor") else param.detach().clone()
    if dist.get_rank() == 0:
        torch.save(weights, Path(out).with_suffix(".pt"))
    report = {"meta_build": meta, "strategy": trainer.parts.strategy, "flops": trainer.loop.meter.flops_per_step,
              "world_size": dist.get_world_size()}
    finish(report, out)


if __name__ == "__main__":
    main(sys.argv[1])
