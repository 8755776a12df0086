"""AdamW over bf16 parameters with fp32 master weights: the optimizer of `precision.policy=bf16-master`.

The model holds bf16 parameters and produces bf16 gradients, so nothing casts weights in the
forward or converts gradients in the backward (what autocast does under `bf16-mixed`). This
optimizer keeps, per parameter, an fp32 master copy and fp32 moments in its state; each step
updates the master with AdamW's arithmetic and writes the bf16 parameter from it. On CUDA the
whole update of a parameter is one Triton kernel (kiln.kernels.master_kernel); elsewhere it is torch
ops on the master, the same sequence as torch's single-tensor AdamW (so on CPU it equals
`torch.optim.AdamW(foreach=False)` run on the fp32 masters bit for bit).

Gradient clipping folds into the update: the training step sets `clip_coef` (a device scalar,
min(1, max_norm / (norm + 1e-6)) as torch's clip_grad_norm_ computes it) and the update multiplies
each fp32-converted gradient by it, so the gradients are read once for the norm and once here.

The masters are created from the parameters at the first step (bf16 values, exact in fp32). They
live in `state`, so `state_dict()` carries them and a resume restores the exact fp32 weights;
`load_state_dict` keeps them (and the moments) in fp32, where torch's would cast every
floating-point state tensor to the parameter's dtype.

Under FSDP2 each parameter is a DTensor holding this rank's shard: its master and moments are
DTensors laid out like it (so DCP saves and reshards them as it does the parameters), and the
update runs on the local shards as plain tensors, one kernel per local shard, with no DTensor
dispatch and no communication (AdamW is elementwise). The clipping coefficient comes from the
global norm over the shards (kiln.distributed.sharded_norm), so every rank scales alike.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
from torch import Tensor

_FP32_STATE = ("master", "exp_avg", "exp_avg_sq")


_DTENSOR: list[type] = []
"""DTensor's class once torch.distributed.tensor is loaded (found once, not per parameter and step)."""


def _is_dtensor(t: Tensor) -> bool:
    """Whether `t` is a DTensor, without importing torch.distributed.tensor (a large import, sympy
    with it): no tensor is one before that module is loaded, and FSDP2 loads it to make any."""
    if not _DTENSOR:
        module = sys.modules.get("torch.distributed.tensor")
        if module is None:
            return False
        _DTENSOR.append(module.DTensor)
    return isinstance(t, _DTENSOR[0])


def _local(t: Tensor) -> Tensor:
    """The tensor the update writes: a DTensor's local shard, or the tensor itself; inside
    torchao's float8 all-gather wrapper of a weight (FSDP2 + float8 tensorwise), its bf16 data."""
    local = t._local_tensor if _is_dtensor(t) else t
    inner = getattr(local, "_tensor", None)
    return inner if isinstance(inner, Tensor) else local


def _fp32_like(p: Tensor, values: Tensor) -> Tensor:
    """`values` (fp32, shaped like p's local part) as state of `p`: a DTensor laid out like `p`
    when `p` is one (its global shape and placements), else `values` itself."""
    if not _is_dtensor(p):
        return values
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(values, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                              stride=p.stride())


def reference_update_(param: Tensor, grad: Tensor, master: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
                      coef: Tensor | None, *, lr: float, weight_decay: float, beta1: float, beta2: float,
                      eps: float, step: int) -> None:
    """The update in torch ops (torch's `_single_tensor_adam` with decoupled weight decay, on the
    fp32 master), then the parameter written from the master."""
    g = grad.float()
    if coef is not None:
        g = g * coef
    master.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    step_size = lr / bias_correction1
    denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(eps)
    master.addcdiv_(exp_avg, denom, value=-step_size)
    param.copy_(master)


class MasterAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, no amsgrad) whose state holds fp32 masters of low-precision
    parameters. `clip_coef` (set before `step`, cleared by it) scales the gradients in the update.
    `use_kernel`: None picks the Triton kernel on CUDA; True/False force it (tests)."""

    def __init__(self, params, lr: float | Tensor = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, *, use_kernel: bool | None = None) -> None:
        if isinstance(lr, Tensor):
            raise ValueError("MasterAdamW takes a float learning rate (its update runs eagerly, not in a CUDA graph)")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})
        self.use_kernel = use_kernel
        self.clip_coef: Tensor | None = None

    def _kernel_for(self, device: torch.device) -> bool:
        if self.use_kernel is not None:
            return self.use_kernel
        from kiln.kernels.master_kernel import supported

        return supported(device)

    def _state_of(self, p: Tensor) -> dict[str, Any]:
        state = self.state[p]
        if not state:
            master = _local(p.detach()).to(torch.float32, copy=True).contiguous()
            state["step"] = torch.tensor(0.0)
            state["master"] = _fp32_like(p, master)
            state["exp_avg"] = _fp32_like(p, torch.zeros_like(master))
            state["exp_avg_sq"] = _fp32_like(p, torch.zeros_like(master))
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        coef, self.clip_coef = self.clip_coef, None
        if coef is not None:
            coef = coef.detach().to(torch.float32).reshape(())
        for group in self.param_groups:
            lr, wd, eps = float(group["lr"]), group["weight_decay"], group["eps"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("MasterAdamW does not support sparse gradients")
                state = self._state_of(p)
                state["step"] += 1
                step = int(state["step"].item())
                param, grad = _local(p), self._local_grad(p)
                master, exp_avg, exp_avg_sq = (_local(state[k]) for k in _FP32_STATE)
                if not grad.is_contiguous():
                    grad = grad.contiguous()
                c = coef.to(param.device) if coef is not None else None
                if self._kernel_for(param.device) and param.is_contiguous():
                    from kiln.kernels.master_kernel import master_adamw_

                    master_adamw_(param, grad, master, exp_avg, exp_avg_sq, c,
                                  decay=1 - lr * wd, beta1=beta1, beta2=beta2, step_size=lr / (1 - beta1**step),
                                  bc2_sqrt=math.sqrt(1 - beta2**step), eps=eps)
                else:
                    reference_update_(param, grad, master, exp_avg, exp_avg_sq, c, lr=lr,
                                      weight_decay=wd, beta1=beta1, beta2=beta2, eps=eps, step=step)
        return loss

    @staticmethod
    def _local_grad(p: Tensor) -> Tensor:
        """The gradient's part of this rank's shard; a DTensor gradient laid out unlike its
        parameter (a Partial sum not reduced yet) has no such part."""
        grad = p.grad
        if not _is_dtensor(p):
            return grad
        if not _is_dtensor(grad) or grad.placements != p.placements:
            raise RuntimeError(f"MasterAdamW: a gradient laid out as {getattr(grad, 'placements', 'a plain tensor')} "
                               f"for a parameter sharded as {p.placements}; the update runs on reduced local shards")
        return grad._local_tensor

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load, then the masters and moments restored in fp32 (torch casts them to the
        parameter's dtype, which would round the masters to bf16)."""
        saved = state_dict["state"]
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        super().load_state_dict(state_dict)
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, p in zip(ids, params):
            if pid not in saved:
                continue
            for key in _FP32_STATE:
                if key in saved[pid]:
                    self.state[p][key] = saved[pid][key].to(device=p.device, dtype=torch.float32, copy=True)
