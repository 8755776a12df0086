"""The rank side of test_meta_init: kiln's decoder under FSDP2 through the trainer's own build (on the
meta device, sharded, then each rank's shards filled), one forward (FSDP2's lazy init); rank 0 saves the
gathered initial weights and reports whether the meta build ran and the FLOPs the loop counted.

$META_INIT_OVERRIDES maps case names to config overrides: the cases are built one after the other
in one launch (each its own trainer, run dir and seeding), their weights saved as OUT's
`<case>.pt` beside it and their reports under their names."""

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


def _build(overrides: list[str], out: Path, case: str) -> dict:
    from kiln.config import load_config
    from kiln.train.trainer import Trainer

    cfg = load_config(None, overrides)
    trainer = Trainer(cfg, out.parent / case / "run")
    meta = trainer.parts.built.initial_values is not None and all(p.is_meta for p in trainer.parts.model.parameters())
    trainer.loop.prepare(_Sinks())
    with torch.no_grad():  # FSDP2's lazy init (first forward) re-points and pads the local shards: values kept
        trainer.loop.model(torch.zeros((1, 8), dtype=torch.long))
    weights = {}
    for name, param in trainer.loop.model.named_parameters():
        weights[name] = param.full_tensor() if hasattr(param, "full_tensor") else param.detach().clone()
    if dist.get_rank() == 0:
        torch.save(weights, out.parent / f"{case}.pt")
    return {"meta_build": meta, "strategy": trainer.parts.strategy, "flops": trainer.loop.meter.flops_per_step,
            "world_size": dist.get_world_size()}


def main(out: str) -> None:
    dist.init_process_group("gloo")
    cases = json.loads(os.environ["META_INIT_OVERRIDES"])  # set by the test
    finish({case: _build(overrides, Path(out), case) for case, overrides in cases.items()}, out)


if __name__ == "__main__":
    main(sys.argv[1])
