"""The optimizer update of FSDP2-sharded parameters, run on their local shards.

Under FSDP2 every parameter, gradient and optimizer-state tensor is a DTensor, so each op of
`optimizer.step()` goes through DTensor's dispatch: sharding propagation over lists of ~150
tensors per foreach/fused op and new DTensorSpecs per output, on the host, every step. Upstream
knows it (pytorch#134191, "AdamW is CPU-bottlenecked with FSDP2"). Updating the local shards as
plain tensors skips that host work (the fsdp_host_overhead results): time a GPU step
cannot hide once the host is behind.

AdamW and SGD are elementwise: each element of a parameter is updated from the same element of its
gradient and state. A rank's local shard of the update is therefore exactly the update of its
local shards, with no communication, whatever the placements (Shard or Replicate; a Partial
gradient would not be reduced yet, so it takes the DTensor path). `ShardLocalAdamW` /
`ShardLocalSGD` are the torch optimizers over the DTensor parameters (state_dict, DCP, LR
schedulers, GradScaler and the non-finite guard see a normal optimizer); only `step()` runs a
second instance of the same torch class over plain views of the local shards whose state entries
are views of the DTensor state, so the update writes where the checkpoint reads.

The DTensor path still runs where the views cannot be set up yet: the first step of a parameter
(torch creates its state then, as DTensors), a closure, a gradient that is not a reduced DTensor.
After `load_state_dict` (a resume) or when FSDP2 replaces a local tensor, the views are rebuilt.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

_FORWARDED = ("grad_scale", "found_inf")  # set by GradScaler / the non-finite guard for fused kernels


def _dtensor_types():
    """(DTensor, the placements of a reduced tensor), or None on a torch without public DTensor."""
    try:
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError:
        return None
    return DTensor, (Shard, Replicate)


class _ShardLocalStep:
    """Mixin before a torch optimizer class: `step()` updates the local shards of DTensor params."""

    _base: type[torch.optim.Optimizer]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._shadow: torch.optim.Optimizer | None = None
        self._pairs: list[tuple[Tensor, Tensor, Tensor]] = []  # (param, its local view, the local tensor it views)
        self._linked_state: object = None
        self._ready: set[int] = set()  # ids of params that the DTensor path has stepped (their state exists)
        self.local_steps = self.dtensor_steps = 0
        """How many steps each path ran (tests and the bench read them)."""

    # -- linking ----------------------------------------------------------------------------------
    def _params(self) -> list[Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def _link(self) -> bool:
        """Build the shadow optimizer over local views; False when some parameter cannot take it."""
        types = _dtensor_types()
        params = self._params()
        if types is None:
            return False
        DTensor, reduced = types
        if not all(isinstance(p, DTensor) and all(isinstance(pl, reduced) for pl in p.placements) for p in params):
            return False
        if any(p.grad is not None and id(p) not in self._ready for p in params):
            return False  # its state is created by the DTensor path first (torch creates it lazily)
        views = {p: p._local_tensor.detach() for p in params}
        groups = []
        for group in self.param_groups:
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": [views[p] for p in group["params"]]})
        accepted = inspect.signature(self._base.__init__).parameters
        shadow = self._base(groups, **{k: v for k, v in self.defaults.items() if k in accepted})
        for p in params:
            state = self.state.get(p)
            if state:
                shadow.state[views[p]] = {k: v._local_tensor if isinstance(v, DTensor) else v
                                          for k, v in state.items()}
        self._shadow = shadow
        self._pairs = [(p, views[p], p._local_tensor) for p in params]
        self._linked_state = self.state
        return True

    def _current(self) -> bool:
        return (self._shadow is not None and self.state is self._linked_state
                and all(p._local_tensor is local for p, _, local in self._pairs))

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self._shadow = None  # new state tensors: the views are rebuilt at the next step

    # -- the step ---------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        if closure is None and (self._current() or self._link()) and self._local_step():
            self.local_steps += 1
            return None
        self._shadow = None
        self.dtensor_steps += 1
        result = inspect.unwrap(self._base.step)(self, closure)
        self._ready.update(id(p) for p in self._params() if p.grad is not None)
        return result

    def _local_step(self) -> bool:
        """The update on the local views; False (nothing done) when a gradient has no state yet or
        is not laid out like its parameter (not a reduced shard of it)."""
        ok = True
        ready = self._ready
        for p, view, _ in self._pairs:
            grad = p.grad
            if grad is None:
                continue  # its view's grad is None already (cleared after every step)
            # FSDP2 builds each reduced gradient with its parameter's own DTensorSpec object, so
            # the identity test settles the usual case without comparing placements (host time).
            spec = getattr(grad, "_spec", None)
            if id(p) not in ready or (spec is not p._spec and getattr(spec, "placements", None) != p.placements):
                ok = False
                break
            view.grad = grad._local_tensor
        shadow = self._shadow
        try:
            if ok:
                for group, local_group in zip(self.param_groups, shadow.param_groups):
                    for key, value in group.items():  # the LR scheduler writes the main groups
                        if key != "params":
                            local_group[key] = value
                for name in _FORWARDED:
                    setattr(shadow, name, getattr(self, name, None))
                inspect.unwrap(type(shadow).step)(shadow)
        finally:
            for _, view, _ in self._pairs:  # FSDP2 frees its gradient at zero_grad: hold no reference
                view.grad = None
            for name in _FORWARDED:
                setattr(shadow, name, None)
        return ok


def update_paths(optimizer: torch.optim.Optimizer) -> dict[str, int] | None:
    """Steps run on the local shards and through DTensor, for a run's summary (None: not sharded)."""
    if not isinstance(optimizer, _ShardLocalStep):
        return None
    return {"local_shards": optimizer.local_steps, "dtensor": optimizer.dtensor_steps}


class ShardLocalAdamW(_ShardLocalStep, torch.optim.AdamW):
    """torch.optim.AdamW whose step runs on FSDP2's local shards (see the module docstring)."""

    _base = torch.optim.AdamW


class ShardLocalSGD(_ShardLocalStep, torch.optim.SGD):
    """torch.optim.SGD whose step runs on FSDP2's local shards (see the module docstring)."""

    _base = torch.optim.SGD
