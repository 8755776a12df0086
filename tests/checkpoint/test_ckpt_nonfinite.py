"""NonFiniteGuard: `error` names the first bad step; `skip` drops updates and stops after M in a row."""

from __future__ import annotations

import pytest
import torch

from kiln.checkpoint import AppState, NonFiniteError, NonFiniteGuard

from .ckpt_helpers import checkpointer

NAN = float("nan")


def _model_and_optimizer(**kwargs):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1, **kwargs)


def _step(guard: NonFiniteGuard, model, optimizer, step: int, bad: bool, scaler=None) -> None:
    loss = model(torch.ones(3, 4)).sum() * (NAN if bad else 1.0)
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = None if scaler is not None else torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    flag = guard.observe(loss, grad_norm, step)
    guard.step_optimizer(optimizer, flag, scaler)
    optimizer.zero_grad(set_to_none=True)


def _state(model, optimizer) -> list[torch.Tensor]:
    tensors = [p.detach().clone() for p in model.parameters()]
    for state in optimizer.state.values():
        tensors += [v.clone() for v in state.values()]
    return tensors


def test_error_reports_the_first_bad_step() -> None:
    model, optimizer = _model_and_optimizer()
    guard = NonFiniteGuard("error", 3)
    for step in range(1, 8):
        _step(guard, model, optimizer, step, bad=step in (5, 6))
        if step == 4:
            assert guard.check() == {"nonfinite_skipped": 0, "nonfinite_consecutive": 0}
    with pytest.raises(NonFiniteError, match=r"non-finite loss or gradient norm at step 5\b") as info:
        guard.check()
    assert info.value.step == 5


def test_no_host_read_per_step(monkeypatch) -> None:
    """observe + step_optimizer with a fused optimizer never bring a device value to the host."""
    runs = [(NonFiniteGuard(policy, 3), *_model_and_optimizer(fused=True)) for policy in ("error", "skip")]

    def forbidden(*args, **kwargs):
        raise AssertionError("host read of a device value")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    for step in range(1, 4):
        for guard, model, optimizer in runs:
            _step(guard, model, optimizer, step, bad=step == 2)
    monkeypatch.undo()
    assert runs[1][0].check() == {"nonfinite_skipped": 1, "nonfinite_consecutive": 0}
    with pytest.raises(NonFiniteError, match="at step 2"):
        runs[0][0].check()


@pytest.mark.parametrize("kind", ["fused", "foreach", "scaler"])
def test_skip_drops_the_update(kind: str) -> None:
    model, optimizer = _model_and_optimizer(**({"fused": True} if kind == "fused" else {"foreach": True}))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4) if kind == "scaler" else None
    guard = NonFiniteGuard("skip", 3)
    _step(guard, model, optimizer, 1, bad=False, scaler=scaler)
    before = _state(model, optimizer)
    _step(guard, model, optimizer, 2, bad=True, scaler=scaler)
    after = _state(model, optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before, after))  # params, moments and step count
    _step(guard, model, optimizer, 3, bad=False, scaler=scaler)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not torch.equal(model.weight, before[0])
    assert guard.check() == {"nonfinite_skipped": 1, "nonfinite_consecutive": 0}


def test_skip_stops_after_max_consecutive() -> None:
    model, optimizer = _model_and_optimizer(fused=True)
    guard = NonFiniteGuard("skip", 3)
    pattern = {2: True, 3: True, 4: False, 5: True, 6: True, 7: True, 8: True}
    for step, bad in pattern.items():
        _step(guard, model, optimizer, step, bad)
    with pytest.raises(NonFiniteError, match=r"3 consecutive non-finite steps, the last at step 7") as info:
        guard.check()
    assert info.value.step == 7


def test_counters_survive_a_checkpoint(tmp_path) -> None:
    model, optimizer = _model_and_optimizer(fused=True)
    guard = NonFiniteGuard("skip", 3)
    for step, bad in enumerate([False, True, True], start=1):
        _step(guard, model, optimizer, step, bad)
    app = AppState(model, optimizer, guard=guard)
    saved = checkpointer(tmp_path).save(3, app)

    model2, optimizer2 = _model_and_optimizer(fused=True)
    guard2 = NonFiniteGuard("skip", 3)
    checkpointer(tmp_path).load(saved, AppState(model2, optimizer2, guard=guard2))
    _step(guard2, model2, optimizer2, 4, bad=True)  # third in a row, across the resume
    with pytest.raises(NonFiniteError, match="the last at step 4"):
        guard2.check()


def test_error_policy_never_saves_a_nonfinite_state(tmp_path) -> None:
    model, optimizer = _model_and_optimizer()
    guard = NonFiniteGuard("error", 3)
    app = AppState(model, optimizer, guard=guard)
    ck = checkpointer(tmp_path)
    _step(guard, model, optimizer, 1, bad=False)
    ck.save(1, app)
    _step(guard, model, optimizer, 2, bad=True)
    with pytest.raises(NonFiniteError, match="at step 2"):
        ck.save(2, app)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000001"]
