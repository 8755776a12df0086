"""Is a compiled recipe right? PyTorch's benchmark-harness rule (benchmarks/dynamo/common.py,
`check_accuracy`), applied to what kiln runs.

- Three runs from the same initial weights, batches and RNG seed: eager at the row's precision
  (`ref`), the compiled recipe (`res`) and eager in float64 (`fp64_ref`).
- Training compares the loss trajectory over the first few optimizer steps (it carries the
  forward, the backward and the update); inference compares the outputs on one batch.
- `torch._dynamo.utils.same(ref, res, fp64_ref, tol=..., equal_nan=...)`: pass if
  `allclose(ref, res, atol=tol, rtol=tol)`, else if `rmse(res, fp64) <= m * rmse(ref, fp64) +
  tol / 10` (m = 2, or 3 for small tensors and 16-bit results). Without an fp64 reference the
  harness falls back to cosine similarity >= 0.99, and so does kiln.
- Tolerances by precision follow the harness's suites (timm_models.py, huggingface.py):
  training 1e-2 (4e-2 for bf16 weights), inference 1e-3 for fp32 and fp16 autocast, 4e-3 for
  bf16 autocast, 1e-2 for bf16 weights; NaNs compare equal except in fp32.
- Inductor draws random numbers with its own generator, so dropout masks differ from eager ones.
  The harness's accuracy runs set `torch._inductor.config.fallback_random = True` (eager's RNG);
  kiln detects whether the eager step draws random numbers (`uses_rng`) and, if so, checks a
  separate compiled copy under that setting, so the timed copy stays exactly what training runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

_TOLERANCE = {
    (True, "fp32"): 1e-2,
    (True, "bf16-mixed"): 1e-2,
    (True, "fp16-mixed"): 1e-2,
    (True, "bf16-true"): 4e-2,
    (True, "bf16-master"): 1e-2,
    (False, "fp32"): 1e-3,
    (False, "bf16-mixed"): 4e-3,
    (False, "fp16-mixed"): 1e-3,
    (False, "bf16-true"): 1e-2,
    (False, "bf16-master"): 1e-2,
}


def tolerance(precision: str, train: bool) -> float:
    return _TOLERANCE.get((train, precision), 1e-2)


def _rng_states(device: torch.device) -> list[torch.Tensor]:
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


def uses_rng(fn: Callable[[], Any], device: torch.device | str = "cpu") -> tuple[Any, bool]:
    """Run `fn` once (eagerly) and say whether it drew random numbers (dropout and the like).

    Compares the generators' states before and after rather than looking for random ops: ops
    tagged `nondeterministic_seeded` include scaled_dot_product_attention, which draws nothing
    when its dropout is 0 (ViT), and a false alarm would cost a second compile per row.
    """
    device = torch.device(device)
    before = _rng_states(device)
    result = fn()
    after = _rng_states(device)
    return result, any(not torch.equal(a, b) for a, b in zip(before, after))


@contextlib.contextmanager
def eager_random() -> Iterator[None]:
    """Compiled code draws random numbers through eager's generator, as the harness's accuracy runs do."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(fallback_random=True):
        yield


def _as_tensor(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, float) for v in value):
        return torch.tensor(value, dtype=torch.float32)
    return value


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.sqrt(torch.mean(torch.square(a.double() - b.double()))))


def compare(ref: Any, res: Any, fp64_ref: Any, *, precision: str, train: bool) -> dict[str, Any]:
    """The harness's verdict plus the figures behind it; `ok` is the verdict, `reason` says why not."""
    from torch._dynamo.utils import same

    ref, res = _as_tensor(ref), _as_tensor(res)
    if isinstance(fp64_ref, (list, tuple)):
        fp64_ref = torch.tensor(fp64_ref, dtype=torch.float64)
    elif isinstance(fp64_ref, torch.Tensor):
        fp64_ref = fp64_ref.detach().cpu().double()
    tol = tolerance(precision, train)
    out: dict[str, Any] = {"accuracy_tol": tol, "accuracy_rule": "cosine" if fp64_ref is None else "fp64 rmse"}
    if isinstance(ref, torch.Tensor) and isinstance(res, torch.Tensor) and ref.shape == res.shape:
        out["max_abs_err"] = float((ref.double() - res.double()).abs().max()) if ref.numel() else 0.0
        if isinstance(fp64_ref, torch.Tensor) and fp64_ref.shape == ref.shape:
            out["rmse_vs_fp64"] = _rmse(res, fp64_ref)
            out["eager_rmse_vs_fp64"] = _rmse(ref, fp64_ref)
    messages: list[str] = []

    def log_error(msg: str, *args: Any) -> None:
        messages.append(msg % args if args else msg)

    try:
        ok = bool(same(ref, res, fp64_ref, cos_similarity=fp64_ref is None, tol=tol,
                       equal_nan=precision != "fp32", log_error=log_error))
    except Exception as exc:  # the harness counts a comparison that raises as a failure too
        ok = False
        messages.append(f"{type(exc).__name__}: {exc}")
    out["accuracy"] = "pass" if ok else "fail"
    if not ok:
        what = "loss trajectory" if train else "outputs"
        detail = messages[-1] if messages else "not within tolerance"
        out["accuracy_reason"] = f"{what} differ from eager beyond tol {tol:g} ({detail})"
    return out
