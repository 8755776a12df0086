"""A standalone script that reproduces a `kiln doctor` failure: load the target, run the failing
backend on the same inputs, assert. User factories are imported with importlib only, so the
script can go into a PyTorch bug report as is; registry models (`mlp`, `vit`, ...) need kiln.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from string import Template
from typing import Any

import torch
from torch.utils._pytree import tree_map

from kiln.models.registry import REGISTRY

_SCRIPT = Template('''"""Repro written by `kiln doctor`: $target under backend=$backend_text mode=$mode_text.

Observed with torch $torch_version: $status - $error
Run: python $script_name   (exit status 1: reproduced; 0: not reproduced; 2: the script could not set up)
"""

import copy
import hashlib
import importlib
import importlib.util
import sys
import traceback
from pathlib import Path

import torch
import torch._dynamo.config
import torch.distributed
import torch._inductor.config
from torch.utils._pytree import tree_leaves

# Non-default compiler settings in effect when the failure was seen (codegen_config, as the minifier does).
$config_lines

TARGET = $target_repr
KWARGS = $kwargs_repr
BACKEND = $backend_repr
MODE = $mode_repr
TRAIN = $train
TOL = $tol
# The model calls torch.distributed in forward: run it in a 1-process gloo group, as kiln doctor did.
NEEDS_PROCESS_GROUP = $needs_pg


def load_inputs():
    """The inputs kiln doctor used; weights_only=False only when they hold Python objects of yours (a
    dataclass) that kiln saved, which load once the model's module is loaded."""
    return torch.load(Path(__file__).with_name($inputs_name), weights_only=$weights_only)


def load_by_path(ref):
    where, _, name = ref.rpartition(":")
    if where.endswith(".py") or "/" in where:
        path = Path(where).resolve()
        sys.path.insert(0, str(path.parent))  # as `python file.py` would: its sibling modules import
        # The module name kiln gave the file, so objects pickled from it (inputs) load back.
        mod_name = f"kiln_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


def load_model():
$load_body


def run(model, inputs):
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(TRAIN):
        out = model(*inputs)
        grads = {}
        if TRAIN:
            sum(t.float().sum() for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad).backward()
            grads = {n: p.grad for n, p in getattr(model, "_orig_mod", model).named_parameters() if p.grad is not None}
    named = {f"output[{i}]": t for i, t in enumerate(tree_leaves(out)) if isinstance(t, torch.Tensor)}
    named.update({f"grad:{k}": v for k, v in grads.items()})
    return named


def upcast(x):
    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def references():
    """(model, inputs, eager results, float64 results): what the compiled run is judged against."""
    torch.manual_seed(0)
    model = load_model().eval()
    inputs = load_inputs()
    eager = run(copy.deepcopy(model), inputs)
    try:
        fp64 = run(copy.deepcopy(model).double(), tuple(upcast(x) for x in inputs))
    except Exception:  # no float64 kernel for some op: judge against eager alone, as kiln doctor does
        fp64 = {n: None for n in eager}
    return model, inputs, eager, fp64


def main():
    from torch._dynamo.utils import same

    if NEEDS_PROCESS_GROUP and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        model, inputs, eager, fp64 = references()
        backend = load_by_path(BACKEND) if ":" in BACKEND else BACKEND
    except Exception as exc:
        print(f"could not set up the repro (not the compiler's failure): {type(exc).__name__}: {exc}")
        return 2
    # inductor draws random numbers as eager does (the dynamo benchmark harness's accuracy setting)
    torch._inductor.config.fallback_random = True
    torch.manual_seed(0)
    try:
        compiled = run(torch.compile(copy.deepcopy(model), backend=backend, mode=MODE), inputs)
    except Exception:
        traceback.print_exc()
        print(f"reproduced: backend {BACKEND!r} crashed")
        return 1
    bad = [n for n in eager if not same(eager[n], compiled[n], fp64_ref=fp64[n], tol=TOL, equal_nan=True)]
    if bad:
        print("reproduced: accuracy failure (harness rule, torch._dynamo.utils.same) in:", ", ".join(bad))
        return 1
    print("not reproduced: compiled results match eager")
    return 0


if __name__ == "__main__":
    sys.exit(main())
''')

_USER_LOAD = '''    result = load_by_path(TARGET)(**KWARGS)
    return result[0] if isinstance(result, tuple) else getattr(result, "module", result)'''
_KILN_LOAD = '''    from kiln.config.schema import ModelConfig  # a registry model: needs kiln installed
    from kiln.models import build_model

    return build_model(ModelConfig(name=TARGET, kwargs=KWARGS)).module'''


def _config_lines() -> str:
    lines = []
    for name in ("torch._dynamo.config", "torch._inductor.config"):
        try:
            module = importlib.import_module(name)
            lines.append(module.codegen_config())
        except Exception:  # older torch without codegen_config: the repro runs on defaults
            continue
    return "\n".join(line for line in lines if line.strip()) or "# (none)"


def _is_user_factory(spec: str) -> bool:
    return spec not in REGISTRY and ":" in spec and not spec.startswith(("timm:", "hf:"))


def _absolute_target(spec: str) -> str:
    where, sep, func = spec.rpartition(":")
    if sep and (where.endswith(".py") or "/" in where):
        return f"{Path(where).expanduser().resolve()}:{func}"
    return spec


def write_repro(
    target_spec: str,
    kwargs: dict[str, Any],
    stage: dict[str, Any],
    backend: Any,
    inputs: tuple[Any, ...],
    train: bool,
    tol: float,
    out_dir: str | Path,
    needs_process_group: bool = False,
) -> Path | None:
    """Write `kiln_repro_<stage>.py` (+ its inputs .pt) into out_dir; None when the backend is a Python
    object that a script cannot name (registered in-process only)."""
    label = re.sub(r"[^A-Za-z0-9_]+", "_", stage["backend"]).strip("_") or "stage"
    if callable(backend):
        backend_ref = stage["backend"] if ":" in stage["backend"] else None
        if backend_ref is None:
            return None
        backend_ref = _absolute_target(backend_ref)
    else:
        backend_ref = backend
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    script = out / f"kiln_repro_{label}.py"
    inputs_file = out / f"kiln_repro_{label}_inputs.pt"
    torch.save(tuple(tree_map(lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x, list(inputs))),
               inputs_file)
    try:  # inputs may hold any Python value; a dataclass needs the full unpickler to load back
        torch.load(inputs_file, weights_only=True)
        weights_only = True
    except Exception:  # unpickling errors come in many types
        weights_only = False
    target = _absolute_target(target_spec)
    script.write_text(_SCRIPT.substitute(
        target=target,
        backend_text=stage["backend"],
        mode_text=stage.get("mode") or "default",
        torch_version=torch.__version__,
        status=stage["status"],
        error=(stage.get("error") or f"max_abs_err {stage.get('max_abs_err')}").replace('"""', "'''"),
        script_name=script.name,
        target_repr=repr(target),
        kwargs_repr=repr(dict(kwargs)),
        backend_repr=repr(backend_ref),
        mode_repr=repr(stage.get("mode")),
        train=repr(bool(train)),
        tol=repr(tol),
        inputs_name=repr(inputs_file.name),
        config_lines=_config_lines(),
        load_body=_USER_LOAD if _is_user_factory(target_spec) else _KILN_LOAD,
        needs_pg=repr(bool(needs_process_group)),
        weights_only=repr(weights_only),
    ))
    return script
