"""Graph-break and recompile categories, read from torch's reason text and the user's source line.

torch's wording changes between releases (2.6 says `generic_jump TensorVariable()`, 2.13 adds a
`gb_type` title, an explanation and hints), so each category matches several phrasings and the
source line is the tie-breaker. The fixes are kiln's; torch's own explanation is kept next to
them in the report.
"""

from __future__ import annotations

import re

DATA_DEPENDENT_BRANCH = "data-dependent branch"
SCALAR_OUTPUT = "scalar output (.item())"
PRINT_LOGGING = "print/logging"
UNSUPPORTED_CALL = "unsupported builtin or library call"
NUMPY = "numpy"
COLLECTIVE = "collective or side effect"
DYNAMIC_SHAPE = "dynamic shape"
OTHER = "other"
BREAK_CATEGORIES = (
    DATA_DEPENDENT_BRANCH, SCALAR_OUTPUT, PRINT_LOGGING, UNSUPPORTED_CALL, NUMPY, COLLECTIVE, DYNAMIC_SHAPE, OTHER
)

BREAK_HINTS = {
    DATA_DEPENDENT_BRANCH: (
        "Python `if`/`while`/`bool()` on a tensor value: use `torch.where(cond, a, b)` for element-wise choices or "
        "`torch.cond(pred, true_fn, false_fn, operands)` for two branches; or decide the branch from a Python value "
        "outside the model."
    ),
    SCALAR_OUTPUT: (
        "Keep the value as a 0-d tensor instead of calling `.item()`/`.tolist()`; if a Python number is needed, set "
        "`torch._dynamo.config.capture_scalar_outputs = True` (traced as an unbacked symbol), or return the tensor "
        "and read it after the step (logging once per N steps, not inside forward)."
    ),
    PRINT_LOGGING: (
        "Move the print/log out of forward (log the returned tensors after the step), guard it with "
        "`if not torch.compiler.is_compiling():`, or list the function in "
        "`torch._dynamo.config.reorderable_logging_functions` so it runs after the graph."
    ),
    UNSUPPORTED_CALL: (
        "torch cannot trace this call: register it as a custom op (`torch.library.custom_op`), allow it with "
        "`torch.compiler.allow_in_graph` if it only calls torch ops, or move it out of forward; "
        "`@torch.compiler.disable` on a small helper makes the remaining break explicit and cheap."
    ),
    NUMPY: (
        "Use the torch equivalent in forward (torch traces much of NumPy through torch._numpy, but not this); or "
        "put the NumPy code in a helper decorated with `@torch.compiler.disable`."
    ),
    COLLECTIVE: (
        "Keep communication out of forward (DDP/FSDP hooks do it), use synchronous functional collectives "
        "(`torch.distributed._functional_collectives`, no `async_op=True`), or isolate the call behind "
        "`torch.compiler.disable`."
    ),
    DYNAMIC_SHAPE: (
        "The output shape depends on tensor values (nonzero, unique, boolean masking): set "
        "`torch._dynamo.config.capture_dynamic_output_shape_ops = True`, or keep shapes static "
        "(`torch.where` with a mask, `torch.nonzero_static`)."
    ),
    OTHER: "Read torch's explanation above; `@torch.compiler.disable` on the offending helper makes the boundary explicit.",
}

_COLLECTIVE_CODE = re.compile(r"\b(dist|torch\.distributed)\.\w+\(")
_NUMPY_CODE = re.compile(r"\bnp\.|\bnumpy\b|\.numpy\(\)")

_RULES: list[tuple[str, re.Pattern, re.Pattern | None]] = [
    # (category, pattern on torch's reason, pattern on the user's source line)
    (
        COLLECTIVE,
        re.compile(r"torch\.distributed|c10d|ProcessGroup|collective|async_op|all_reduce|all_gather|barrier", re.I),
        _COLLECTIVE_CODE,
    ),
    (
        PRINT_LOGGING,
        re.compile(r"`print`|builtin print|BuiltinVariable\(print\)|\blogging|Logger|\bwarnings\.warn|reorderable_logging", re.I),
        re.compile(r"^\s*(print\(|(log|logger|logging|warnings)\.\w+\()"),
    ),
    (
        SCALAR_OUTPUT,
        re.compile(r"Tensor\.item|\.item\(\)|_local_scalar_dense|capture_scalar_outputs|tolist|Data dependent operator", re.I),
        re.compile(r"\.item\(\)|\.tolist\(\)|\b(float|int)\(.*\)"),
    ),
    (
        DYNAMIC_SHAPE,
        re.compile(r"dynamic shape operator|dynamic_output_shape|output shape depends|unbacked", re.I),
        re.compile(r"\b(nonzero|unique|masked_select)\("),
    ),
    (
        DATA_DEPENDENT_BRANCH,
        re.compile(r"generic_jump|data-dependent (branch|assert|control)|jump.*tensor|branching on", re.I),
        re.compile(r"^\s*(if|elif|while|assert)\b"),
    ),
    (
        NUMPY,
        re.compile(r"numpy|torch\._numpy|ndarray", re.I),
        _NUMPY_CODE,
    ),
    (
        UNSUPPORTED_CALL,
        re.compile(
            r"marked as skipped|skip|Failed to trace builtin|builtin|C/C\+\+|pybind|compiler\.disable|"
            r"unsupported (function|method|call)|call_function|call_method|not supported",
            re.I,
        ),
        None,
    ),
]


def classify_break(reason: str, code: str) -> str:
    """The category of a graph break: torch's reason first, the source line as fallback."""
    if _COLLECTIVE_CODE.search(code or ""):
        # torch often words a failing collective as a generic skipped call (e.g. `dist.barrier()`).
        return COLLECTIVE
    for category, on_reason, _ in _RULES:
        if on_reason.search(reason or ""):
            # A numpy call that fails with a generic reason is still a numpy problem.
            if category in (UNSUPPORTED_CALL, OTHER) and _NUMPY_CODE.search(code or ""):
                return NUMPY
            return category
    for category, _, on_code in _RULES:
        if on_code is not None and on_code.search(code or ""):
            return category
    return OTHER


def headline(reason: str) -> str:
    """torch's one-line title of a reason (2.13: the gb_type line; older: the first line)."""
    lines = [ln.strip() for ln in (reason or "").splitlines() if ln.strip()]
    skip = ("Encountered graph break when attempting", "Graph Break Reason:")
    for ln in lines:
        if not ln.startswith(skip):
            return ln
    return lines[0] if lines else ""


def explanation(reason: str) -> str:
    """torch's own explanation and hints, without the developer debug context and links."""
    keep = []
    for ln in (reason or "").splitlines():
        s = ln.strip()
        if s.startswith(("Developer debug context", "For more details")):
            continue
        if s.startswith(("Explanation:", "Hint:")):
            keep.append(s)
    return "\n".join(keep) or headline(reason)


# --- recompiles ---------------------------------------------------------------------------------

SHAPE_CHANGE = "shape change"
PYTHON_SCALAR = "python scalar value"
DTYPE_CHANGE = "dtype change"
REQUIRES_GRAD = "requires_grad change"
GLOBAL_STATE = "global state (grad mode / autocast)"
OBJECT_IDENTITY = "object identity"
RECOMPILE_OTHER = "other guard"

_GUARD_RULES: list[tuple[str, re.Pattern, str]] = [
    (
        SHAPE_CHANGE,
        re.compile(r"size mismatch|stride mismatch|\.size\(\)|\.shape\b|sizes\(\)", re.I),
        "A tensor's shape changed. torch marks that dimension dynamic after this first recompile (automatic dynamic "
        "shapes) unless dynamic=False; to skip the specialised first graph, call "
        "`torch._dynamo.mark_dynamic(x, dim)` on the input before the first call or compile with dynamic=True; "
        "or pad/bucket inputs to a few fixed sizes.",
    ),
    (
        DTYPE_CHANGE,
        re.compile(r"dtype mismatch|dtype", re.I),
        "The input dtype changed, and each dtype gets its own graph: cast inputs to one dtype before the compiled "
        "call, or accept one cached graph per dtype (each counts against torch._dynamo.config.recompile_limit).",
    ),
    (
        REQUIRES_GRAD,
        re.compile(r"requires_grad", re.I),
        "An input's requires_grad changed (e.g. training vs evaluation): one graph per setting is expected; detach "
        "inputs consistently if the change was accidental.",
    ),
    (
        GLOBAL_STATE,
        re.compile(r"GLOBAL_STATE|grad_mode|autocast|torch_function_mode", re.I),
        "Global state differed between calls (grad mode, autocast, ...): each combination compiles once; run "
        "inference under the same context every time (e.g. always `torch.inference_mode()`).",
    ),
    (
        OBJECT_IDENTITY,
        re.compile(r"___check_obj_id|ID_MATCH|\bid\(|___check_type_id|TYPE_MATCH", re.I),
        "A different Python object (a new module, function or class instance) was passed: create it once, "
        "outside the loop, and reuse it.",
    ),
    (
        PYTHON_SCALAR,
        re.compile(r"(==|!=)\s*-?\d|\bL\[.*\]\s*==", re.I),
        "A Python number argument changed and was baked into the graph as a constant: pass it as a tensor "
        "(`torch.tensor(value)`), or let torch treat it as dynamic after this recompile (automatic dynamic for "
        "ints/floats; `torch._dynamo.config.specialize_float=False` for floats on older torch).",
    ),
]


def classify_guard(guard: str) -> tuple[str, str]:
    """(category, fix) for a failing guard."""
    for category, pattern, hint in _GUARD_RULES:
        if pattern.search(guard or ""):
            return category, hint
    return RECOMPILE_OTHER, (
        "A guard on this input failed; see the guard text. `TORCH_LOGS=recompiles_verbose` shows every guard that "
        "failed; if the value is meant to vary, make it a tensor input."
    )
