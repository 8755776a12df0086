"""Is a compiled result correct? The rule of PyTorch's dynamo benchmark harness.

benchmarks/dynamo/common.py (check_accuracy) compares the compiled result with eager through
`torch._dynamo.utils.same(eager, compiled, fp64_ref=fp64, tol=tol)`: first allclose with
atol=rtol=tol; failing that, the compiled result passes if its RMSE against a float64 run is
within a multiplier (2, or 3 for small tensors) of eager's RMSE against the same float64 run, plus
tol/10. A compiled kernel that rounds differently from eager but is no further from the exact
answer passes; one that drifts does not. Tolerances are torchbench's float32 defaults
(benchmarks/dynamo/torchbench.py get_tolerance_and_cosine_flag): 1e-4, 1e-3 for training.
"""

from __future__ import annotations

import copy
import inspect
import math
from typing import Any

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves

from kiln.diagnose.call_target import call

FORWARD_TOL = 1e-4
TRAIN_TOL = 1e-3


def _upcast(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().to("cpu", torch.float64).requires_grad_(x.requires_grad)
    if isinstance(x, torch.Tensor):
        return x.to("cpu")
    return float(x) if isinstance(x, float) else x


def fp64_reference(module: nn.Module, inputs: tuple[Any, ...], train: bool):
    """(outputs, grads) of a float64 copy of the model on CPU with upcast inputs; None if the model
    cannot run in float64 (some ops have no double kernel): then eager is the only reference."""
    try:
        ref = copy.deepcopy(module).to("cpu", torch.float64)
        return call(ref, tuple(_upcast(x) for x in inputs), train, ref)
    except Exception:
        return None


def named_results(outputs: Any, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every tensor a stage produced, by a stable name: `output[i]`, `grad:<param>`."""
    named = {f"output[{i}]": t for i, t in enumerate(tree_leaves(outputs)) if isinstance(t, torch.Tensor)}
    named.update({f"grad:{k}": v for k, v in grads.items()})
    return named


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return math.sqrt(torch.mean((a.double() - b.double()) ** 2).item()) if a.numel() else 0.0


def _harness_rule(ref: torch.Tensor, res: torch.Tensor, fp64: torch.Tensor | None, tol: float) -> bool:
    """The same() rule, for a torch without torch._dynamo.utils.same (or one whose same() fails)."""
    if torch.allclose(ref.double(), res.double(), atol=tol, rtol=tol, equal_nan=True):
        return True
    if fp64 is None:
        return False
    multiplier = 3.0 if fp64.numel() < 1000 else 2.0
    return _rmse(fp64, res) <= multiplier * _rmse(fp64, ref) + tol / 10.0


def _same(ref: torch.Tensor, res: torch.Tensor, fp64: torch.Tensor | None, tol: float) -> bool:
    try:
        from torch._dynamo.utils import same
    except ImportError:
        return _harness_rule(ref, res, fp64, tol)
    kwargs: dict[str, Any] = {"fp64_ref": fp64, "tol": tol, "equal_nan": True}
    if "log_error" in inspect.signature(same).parameters:
        kwargs["log_error"] = lambda *a, **k: None  # we report the numbers ourselves
    try:
        return bool(same(ref, res, **kwargs))
    except Exception:
        return _harness_rule(ref, res, fp64, tol)


def compare(
    eager: dict[str, torch.Tensor], compiled: dict[str, torch.Tensor], fp64: dict[str, torch.Tensor] | None, tol: float
) -> dict[str, Any]:
    """ok, the worst errors against eager, and the tensors that failed the harness rule."""
    failing: list[str] = []
    max_abs = max_rel = 0.0
    rmse_compiled = rmse_eager = 0.0
    for name, ref in eager.items():
        res = compiled.get(name)
        if res is None or res.shape != ref.shape:
            failing.append(f"{name} (missing or shape {None if res is None else tuple(res.shape)})")
            continue
        ref_c, res_c = ref.detach().cpu(), res.detach().cpu()
        if not ref_c.is_floating_point():
            if not torch.equal(ref_c, res_c):
                failing.append(name)
            continue
        diff = (res_c.double() - ref_c.double()).abs()
        abs_err = float(diff.max()) if diff.numel() else 0.0
        scale = float(ref_c.double().abs().max()) if ref_c.numel() else 0.0
        max_abs = max(max_abs, abs_err) if not math.isnan(abs_err) else math.nan
        max_rel = max(max_rel, abs_err / scale if scale > 0 else abs_err)
        ref64 = fp64.get(name).detach() if fp64 and name in fp64 else None
        if ref64 is not None:
            rmse_compiled = max(rmse_compiled, _rmse(ref64, res_c))
            rmse_eager = max(rmse_eager, _rmse(ref64, ref_c))
        if not _same(ref_c, res_c, ref64, tol):
            failing.append(name)
    return {
        "ok": not failing,
        "max_abs_err": max_abs,
        "max_rel_err": max_rel,
        "rmse_vs_fp64": rmse_compiled if fp64 else None,
        "eager_rmse_vs_fp64": rmse_eager if fp64 else None,
        "failing": failing[:10],
    }
