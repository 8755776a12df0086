"""kiln.distributed.apply: FSDP2's gradient-sync switch is set only when it changes (torch's setter
walks every submodule); gradient accumulation still switches it off and on around each step."""

from __future__ import annotations

import torch

import kiln.distributed.apply as apply_mod
from kiln.config import load_config
from kiln.precision import resolve_precision


def test_fsdp_gradient_sync_is_set_only_on_a_change(monkeypatch):
    calls: list[bool] = []
    # No process group here: the wrapper is stood in for; what is checked is kiln's switching.
    monkeypatch.setattr(apply_mod, "apply_fsdp", lambda model, blocks, cfg, policy, device, reshard=None: model)
    monkeypatch.setattr(apply_mod, "set_gradient_sync", lambda model, enabled: calls.append(enabled))
    cfg = load_config(None, ["training.device=cpu", "distributed.strategy=fsdp", "compile.enabled=false"])
    device = torch.device("cpu")
    model = torch.nn.Linear(4, 4)
    wrapped, grad_sync = apply_mod.apply_parallel(model, [], cfg, resolve_precision("fp32", device), device, "fsdp")
    assert wrapped is model

    def step(micro_steps: int) -> None:
        for i in range(micro_steps):
            with grad_sync(i == micro_steps - 1):
                pass

    for _ in range(3):  # no accumulation: FSDP2 starts with sync on, so nothing to set
        step(1)
    assert calls == []
    step(3)  # off for the first two micro-steps, on for the last
    step(3)
    assert calls == [False, True, False, True]
    step(1)
    assert calls == [False, True, False, True]
