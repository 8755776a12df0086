"""Graph-break and recompile categories, read from torch's reason text and the user's source line.

torch's wording changes between releases (2.6 says `generic_jump TensorVariable()`, 2.13 adds a
`gb_type` title, an explanation and hints), so each category matches several phrasings and the
source line is the tie-breaker. The fixes are kiln's; torch's own explanation is kept next to
them in the report.
"""

from __future__ import annotations

import re

from kiln.diagnose import guards
from kiln.diagnose.equivalents import RANDOM_CALL, numpy_advice, random_advice

# The recompile kinds (guards.py) are kiln.diagnose.break_kinds's names too.
from kiln.diagnose.guards import (  # noqa: F401
    _GUARD_RULES,
    ARG_COUNT,
    BOOL_FLAG,
    CARRIED_VALUE,
    CONTAINER_KEYS,
    DTYPE_CHANGE,
    GLOBAL_STATE,
    LIST_LENGTH,
    MATH_CONSTANT,
    MODULE_ATTRIBUTE,
    OBJECT_IDENTITY,
    PYTHON_SCALAR,
    RECOMPILE_CATEGORIES,
    RECOMPILE_OTHER,
    REQUIRES_GRAD,
    SHAPE_CHANGE,
    SIZE_SPECIALIZED,
    STRING_VALUE,
    classify_guard,
    user_guard,
)

DATA_DEPENDENT_BRANCH = "data-dependent branch"
SCALAR_OUTPUT = "scalar output (.item())"
PRINT_LOGGING = "print/logging"
UNSUPPORTED_CALL = "unsupported builtin or library call"
NUMPY = "numpy"
PY_RANDOM = "python random"
DISABLED = "torch.compiler.disable'd function"
GENERATOR = "next() on a generator"
COLLECTIVE = "collective or side effect"
DYNAMIC_SHAPE = "dynamic shape"
RECURRENT = "recurrent module (RNN/GRU/LSTM)"
PY_SORT = "Python sorted()/min()/max() over tensors"
AUTOGRAD_IN_FORWARD = "torch.autograd.grad in forward"
TORCH_GENERATOR = "torch.Generator passed to a random op"
OTHER = "other"
BREAK_CATEGORIES = (
    DATA_DEPENDENT_BRANCH, SCALAR_OUTPUT, PRINT_LOGGING, UNSUPPORTED_CALL, NUMPY, PY_RANDOM, DISABLED, GENERATOR,
    COLLECTIVE, DYNAMIC_SHAPE, RECURRENT, PY_SORT, AUTOGRAD_IN_FORWARD, TORCH_GENERATOR, OTHER,
)

BREAK_HINTS = {
    DATA_DEPENDENT_BRANCH: (
        "Python `if`/`while`/`bool()` on a tensor value: use `torch.where(cond, a, b)` for element-wise choices or "
        "`torch.cond(pred, true_fn, false_fn, operands)` for two branches; or decide the branch from a Python value "
        "outside the model."
    ),
    SCALAR_OUTPUT: (
        "Keep the value as a 0-d tensor instead of calling `.item()`/`.tolist()` (tensor ops take it as it is), or "
        "return the tensor and read it after the step (logging once per N steps, not inside forward)."
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
    PY_RANDOM: (
        "Python's `random` module runs outside the graph (its state is not a tensor): draw with torch instead, and "
        "keep the decision in tensor code: `torch.where(torch.rand((), device=x.device) < p, a, b)`, or a per-sample "
        "mask `torch.rand(x.shape[0], 1, device=x.device) < p`."
    ),
    DISABLED: (
        "A function decorated with `@torch.compiler.disable` always runs outside the graph, with a graph break "
        "before and after each call: that is what the decorator does, not a tracing failure (no custom op needed). "
        "If the function only calls torch ops, remove the decorator; if one part cannot be traced, move the "
        "decorator onto that part alone."
    ),
    GENERATOR: guards.GENERATOR_HINT,
    COLLECTIVE: (
        "Keep communication out of forward (DDP/FSDP hooks do it), use synchronous functional collectives "
        "(`torch.distributed._functional_collectives`, no `async_op=True`), or isolate the call behind "
        "`torch.compiler.disable`."
    ),
    DYNAMIC_SHAPE: (
        "The output shape depends on tensor values (nonzero, unique, boolean masking): keep shapes static "
        "(`torch.where` with a mask, `torch.nonzero_static(x, size=N)`)."
    ),
    RECURRENT: (
        "torch.compile does not trace `nn.RNN`/`nn.GRU`/`nn.LSTM`: the layer runs eagerly (it is one fused kernel "
        "call already), and everything traced around it is split into separate graphs. Compile the parts around it "
        "instead of the whole model (e.g. `model.encoder.compile()`), or replace the layer by a traceable one."
    ),
    PY_SORT: (
        "Python's `sorted()`/`min()`/`max()` compare tensors one pair at a time in Python, which torch cannot "
        "trace: do it as one tensor op. Stack the keys (`keys = torch.stack([key(t) for t in items])`), then "
        "`order = torch.argsort(keys)` (or `torch.sort`) / `i = torch.argmax(keys)` (or `argmin`), and index the "
        "stacked items with it: `torch.stack(items)[order]`."
    ),
    AUTOGRAD_IN_FORWARD: (
        "A gradient taken inside forward (`torch.autograd.grad`, `requires_grad_()`) is not traced by default: use "
        "`torch.func` (`torch.func.grad`, `jacrev`, `vjp`), which torch.compile traces, or compile only the "
        "function whose gradient is taken and call `torch.autograd.grad` outside the compiled code."
    ),
    TORCH_GENERATOR: (
        "A `torch.Generator` object cannot go into a graph, so the random op runs eagerly between two graphs. Draw "
        "from the default generator instead (seed it with `torch.manual_seed` outside the model; compiled random "
        "ops follow it), or draw the random tensor outside forward with your generator and pass it in."
    ),
    OTHER: "Read torch's explanation above; `@torch.compiler.disable` on the offending helper makes the boundary explicit.",
}

_COLLECTIVE_CODE = re.compile(r"\b(dist|torch\.distributed)\.\w+\(")
_NUMPY_CODE = re.compile(r"\bnp\.|\bnumpy\b|\.numpy\(\)")

_RULES: list[tuple[str, re.Pattern, re.Pattern | None]] = [
    # (category, pattern on torch's reason, pattern on the user's source line)
    (RECURRENT, re.compile(r"RNN, GRU, or LSTM|allow_rnn", re.I), re.compile(r"\b(rnn|gru|lstm)\b", re.I)),
    (
        PY_SORT,
        re.compile(r"sort with non-constant key|_call_min_max|handle op (min|max)\b|BuiltinVariable\((sorted|min|max)\)"),
        re.compile(r"\b(sorted|min|max)\("),
    ),
    (
        AUTOGRAD_IN_FORWARD,
        re.compile(r"torch\.autograd\.grad|trace_autograd_ops|requires_grad_\(\)", re.I),
        re.compile(r"\bautograd\.grad\(|\.requires_grad_\("),
    ),
    (TORCH_GENERATOR, re.compile(r"Variable\(Generator\)|torch\.Generator"), re.compile(r"\bgenerator\s*=")),
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
        DISABLED,
        re.compile(r"compiler\.disable|_dynamo\.disable|disable\(\)`?d function|skipped due to .*disable", re.I),
        None,
    ),
    (
        GENERATOR,
        re.compile(r"next\(\) on generator|tp_iternext|GeneratorObjectVariable|generator object", re.I),
        re.compile(r"\bnext\("),
    ),
    (
        PY_RANDOM,
        re.compile(r"\bRandom\.\w+|\brandom\.(random|uniform|randint|choice|gauss|shuffle|sample)\b"),
        RANDOM_CALL,
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


_gave_up = "Graph break encountered:"


def real_reason(reason: str) -> str:
    """torch's reason without its "Failed to handle graph break gracefully. Skipping the function"
    wrapper (the frame was skipped), which would otherwise read as a generic skipped call."""
    return reason.split(_gave_up, 1)[1].strip() if _gave_up in (reason or "") else (reason or "")


def classify_break(reason: str, code: str) -> str:
    """The category of a graph break: torch's reason first, the source line as fallback."""
    reason = real_reason(reason)
    if _COLLECTIVE_CODE.search(code or ""):
        # torch often words a failing collective as a generic skipped call (e.g. `dist.barrier()`).
        return COLLECTIVE
    for category, on_reason, _ in _RULES:
        if on_reason.search(reason or ""):
            # A numpy call that fails with a generic reason is still a numpy problem.
            if category in (UNSUPPORTED_CALL, OTHER) and _NUMPY_CODE.search(code or ""):
                return NUMPY
            if category in (UNSUPPORTED_CALL, OTHER) and RANDOM_CALL.search(code or ""):
                return PY_RANDOM
            return category
    for category, _, on_code in _RULES:
        if on_code is not None and on_code.search(code or ""):
            return category
    return OTHER


_DISABLED_NAME = re.compile(r"function `?<function ([\w.<>]+) at")


def break_hint(category: str, reason: str, code: str) -> str:
    """The fix for a break, made concrete for the user's line where kiln knows the replacement:
    the torch call for a NumPy or `random` function, the name of a disabled helper."""
    hint = BREAK_HINTS[category]
    if category in (UNSUPPORTED_CALL, OTHER):
        said = torch_words(reason)
        return (f"torch says: {said} " if said else "") + hint
    if category == NUMPY:
        return numpy_advice(reason, code) + hint
    if category == PY_RANDOM:
        return random_advice(code) + hint
    if category == DISABLED:
        m = _DISABLED_NAME.search(reason or "")
        if m:
            return f"`{m[1]}` is decorated with `@torch.compiler.disable`. " + hint
    return hint


_GENERIC_HINT = re.compile(r"report an issue|difficult to debug|write Dynamo tracing rules", re.I)


def torch_words(reason: str) -> str:
    """torch's explanation and its own specific hints, one line, for a break kiln has no better words for."""
    parts = []
    for ln in real_reason(reason).splitlines():
        s = ln.strip()
        if s.startswith(("Explanation:", "Hint:")) and not _GENERIC_HINT.search(s):
            parts.append(s.split(":", 1)[1].strip().rstrip(".") + ".")
    return " ".join(parts) or (headline(reason).rstrip(".") + "." if reason else "")


def headline(reason: str) -> str:
    """torch's one-line title of a reason (2.13: the gb_type line; older: the first line)."""
    lines = [ln.strip() for ln in real_reason(reason).splitlines() if ln.strip()]
    skip = ("Encountered graph break when attempting", "Graph Break Reason:")
    for ln in lines:
        if not ln.startswith(skip):
            return ln
    return lines[0] if lines else ""


def explanation(reason: str) -> str:
    """torch's own explanation and hints, without the developer debug context and links."""
    keep = []
    for ln in real_reason(reason).splitlines():
        s = ln.strip()
        if s.startswith(("Developer debug context", "For more details")):
            continue
        if s.startswith(("Explanation:", "Hint:")):
            keep.append(s)
    return "\n".join(keep) or headline(reason)
