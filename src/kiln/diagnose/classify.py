"""Graph-break and recompile categories, read from torch's reason text and the user's source line.

torch's wording changes between releases (2.6 says `generic_jump TensorVariable()`, 2.13 adds a
`gb_type` title, an explanation and hints), so each category matches several phrasings and the
source line is the tie-breaker. The fixes are kiln's; torch's own explanation is kept next to
them in the report.
"""

from __future__ import annotations

import re

from kiln.diagnose.equivalents import RANDOM_CALL, numpy_advice, random_advice

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
    GENERATOR: (
        "torch cannot step a Python generator kept on the module, so forward breaks at `next()` on every call and "
        "the value it yields is baked into the code after the break (a recompile per new value). Precompute the "
        "values (e.g. a buffer `torch.tensor(values)` indexed by a step-counter tensor), or call `next()` outside "
        "the model and pass the value in as a tensor argument."
    ),
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


_GAVE_UP = "Graph break encountered:"


def real_reason(reason: str) -> str:
    """torch's reason without its "Failed to handle graph break gracefully. Skipping the function"
    wrapper (the frame was skipped), which would otherwise read as a generic skipped call."""
    return reason.split(_GAVE_UP, 1)[1].strip() if _GAVE_UP in (reason or "") else (reason or "")


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


# --- recompiles ---------------------------------------------------------------------------------

SHAPE_CHANGE = "shape change"
PYTHON_SCALAR = "python scalar value"
MATH_CONSTANT = "value fixed by math.*"
BOOL_FLAG = "bool flag (mode switch)"
LIST_LENGTH = "list attribute mutated in forward"
ARG_COUNT = "number of *args"
CARRIED_VALUE = "value carried across a graph break"
DTYPE_CHANGE = "dtype change"
REQUIRES_GRAD = "requires_grad change"
GLOBAL_STATE = "global state (grad mode / autocast)"
OBJECT_IDENTITY = "object identity"
RECOMPILE_OTHER = "other guard"
RECOMPILE_CATEGORIES = (
    SHAPE_CHANGE, PYTHON_SCALAR, MATH_CONSTANT, BOOL_FLAG, LIST_LENGTH, ARG_COUNT, CARRIED_VALUE, DTYPE_CHANGE,
    REQUIRES_GRAD, GLOBAL_STATE, OBJECT_IDENTITY, RECOMPILE_OTHER,
)

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


_NAMED = re.compile(r"[LG]\['([^']+)'\]")
_STACK = re.compile(r"___stack\d+")


def user_guard(guard: str) -> str:
    """torch's guard with `L['x']` written as `x`, as the user wrote it."""
    return _NAMED.sub(r"\1", guard or "")


def _specific_guard(guard: str, code: str, varargs: str | None) -> tuple[str, str] | None:
    """Guards whose fix depends on what the guarded value is, not only on the guard's form."""
    if _STACK.search(guard):
        hint = ("torch guards a value it carries from the code before a graph break into the code after it "
                "(`___stackN` is its internal name: a value computed just before the break). It changed between calls, "
                "so the code after the break recompiles each time; fix the graph break on this line (see the graph "
                "breaks table) and this recompile goes with it.")
        if re.search(r"\bnext\(", code or ""):
            hint += " Here it is the value of `next()` on a generator: " + BREAK_HINTS[GENERATOR]
        return CARRIED_VALUE, hint
    m = re.search(r"len\((\w+)\)", guard)
    if m and m[1] == (varargs or "args"):
        return ARG_COUNT, (
            f"forward takes `*{m[1]}` and was called with a different number of them: each count is a new graph "
            "(and counts against torch._dynamo.config.recompile_limit). Stack the inputs into one tensor (one "
            "argument with a batch or `views` dimension, which dynamic shapes handle), or pad to a fixed count; "
            "if only a few counts occur, accept one graph per count.")
    m = re.search(r"(?:len\((self(?:\.\w+)+)\)|^not (self(?:\.\w+)+)$)", guard)
    if m:
        attr = m[1] or m[2]
        return LIST_LENGTH, (
            f"`{attr}` is a Python list that forward changes (e.g. `.append`) and torch guards on its length, so "
            "every call recompiles until the recompile limit, then runs eagerly. Return the values from forward "
            "and collect them outside the compiled model, or keep a preallocated tensor buffer "
            "(`self.register_buffer`) and write into it at an index tensor.")
    m = re.search(r"^([\w.]+) (?:==|is) (True|False)$", guard) or re.search(r"___check_obj_id\(([\w.]+),", guard)
    if m and (m.lastindex == 2 or re.search(rf"^\s*(el)?if (not )?{re.escape(m[1])}\s*:", code or "")):
        # Older torch guards a bool by identity (True and False are singletons) on its `if` line.
        return BOOL_FLAG, (
            f"`{m[1]}` is a bool that switches forward between modes; each value is its own graph (one recompile "
            "per mode, expected). Compile one function per mode (e.g. a compiled model per value, or "
            "`functools.partial(model, flag=True)`), or, when the condition is data, use `torch.cond(pred, "
            "true_fn, false_fn, operands)` to keep both branches in one graph.")
    math_args = " ".join(re.findall(r"\bmath\.\w+\(([^)]*)\)", code or ""))
    names = [n for n in re.findall(r"[A-Za-z_][\w.]*", guard) if n.split(".")[-1] in re.findall(r"\w+", math_args)]
    if "==" in guard and names:
        return MATH_CONSTANT, (
            f"`{names[0]}` goes through a `math.*` call on this line, which needs a Python number, so torch bakes "
            "its value into the graph as a constant and every new value recompiles; dynamic shapes cannot help. "
            f"Use torch ops on a tensor instead: pass `{names[0]}` as a 0-d tensor and call `torch.exp` / "
            "`torch.log` / `torch.sqrt` ... on it.")
    return None


def classify_guard(guard: str, code: str = "", varargs: str | None = None) -> tuple[str, str]:
    """(category, fix) for a failing guard; `code` is the user's source line, `varargs` the name of
    the recompiled function's `*args` parameter."""
    specific = _specific_guard(user_guard(guard).strip(), code, varargs)
    if specific:
        return specific
    for category, pattern, hint in _GUARD_RULES:
        if pattern.search(guard or ""):
            return category, hint
    return RECOMPILE_OTHER, (
        "A guard on this input failed; see the guard text. `TORCH_LOGS=recompiles_verbose` shows every guard that "
        "failed; if the value is meant to vary, make it a tensor input."
    )
