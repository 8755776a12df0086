"""Recompile kinds, read from the failing guard torch names and the user's source line.

A guard's form says what changed (a size, a number, a dict's keys, an object), the source line says
what the value is to the user (an argument, a module attribute forward writes, a value fed into
`math.*`), and the fix depends on both. kiln.diagnose.break_kinds re-exports these names.
"""

from __future__ import annotations

import re

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
SIZE_SPECIALIZED = "size pinned by a Python use"
MODULE_ATTRIBUTE = "attribute changed in forward"
CONTAINER_KEYS = "container keys or length"
STRING_VALUE = "string argument (mode or task name)"
RECOMPILE_OTHER = "other guard"
RECOMPILE_CATEGORIES = (
    SHAPE_CHANGE, PYTHON_SCALAR, MATH_CONSTANT, BOOL_FLAG, LIST_LENGTH, ARG_COUNT, CARRIED_VALUE, DTYPE_CHANGE,
    REQUIRES_GRAD, GLOBAL_STATE, OBJECT_IDENTITY, SIZE_SPECIALIZED, MODULE_ATTRIBUTE, CONTAINER_KEYS, STRING_VALUE,
    RECOMPILE_OTHER,
)
GENERATOR_HINT = (
    "torch cannot step a Python generator kept on the module, so forward breaks at `next()` on every call and "
    "the value it yields is baked into the code after the break (a recompile per new value). Precompute the "
    "values (e.g. a buffer `torch.tensor(values)` indexed by a step-counter tensor), or call `next()` outside "
    "the model and pass the value in as a tensor argument."
)

_GUARD_RULES: list[tuple[str, re.Pattern, str]] = [
    (
        SHAPE_CHANGE,
        re.compile(r"size mismatch|stride mismatch|\.size\(\)|\.shape\b|sizes\(\)", re.I),
        "A tensor's shape changed. On the first change torch recompiles and marks that dimension dynamic "
        "(automatic dynamic shapes), so one recompile is expected; or pad/bucket inputs to a few fixed sizes.",
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
        "(`torch.tensor(value)`). On its first change torch recompiles and treats the number as dynamic "
        "(automatic dynamic for ints and floats), so one recompile is expected.",
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
            hint += " Here it is the value of `next()` on a generator: " + GENERATOR_HINT
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
    m = re.search(r"^(?:len\((\w+)\) (?:==|!=) \d+|list\(dict\.keys\((\w+)\)\)|___dict_contains\(.*?, (\w+)\))", guard)
    if m:
        name = m[1] or m[2] or m[3]
        return CONTAINER_KEYS, (
            f"`{name}` is a Python container (dict, list or tuple) whose keys or length changed between calls; "
            "torch unrolls the code over it and guards on its exact keys and length, so each new set is its own "
            "graph. Pass the same keys and length on every call (absent entries as zeros plus a mask tensor), or "
            "stack the values into one tensor with a dimension for them; if only a few sets occur, expect one graph "
            "each (each counts against torch._dynamo.config.recompile_limit).")
    m = re.search(r"^([\w.]+) (?:==|!=) '", guard)
    if m:
        return STRING_VALUE, (
            f"`{m[1]}` is a string that selects what forward does; each value is its own graph (one recompile per "
            "value is expected, up to torch._dynamo.config.recompile_limit values). If a few values occur, that is "
            "fine; else compile one function per value, or turn the choice into tensor data (an index tensor "
            "selecting rows of stacked weights).")
    math_args = " ".join(re.findall(r"\bmath\.\w+\(([^)]*)\)", code or ""))
    names = [n for n in re.findall(r"[A-Za-z_][\w.]*", guard) if n.split(".")[-1] in re.findall(r"\w+", math_args)]
    if "==" in guard and names:
        return MATH_CONSTANT, (
            f"`{names[0]}` goes through a `math.*` call on this line, which needs a Python number, so torch bakes "
            "its value into the graph as a constant and every new value recompiles; dynamic shapes cannot help. "
            f"Use torch ops on a tensor instead: pass `{names[0]}` as a 0-d tensor and call `torch.exp` / "
            "`torch.log` / `torch.sqrt` ... on it.")
    m = re.search(r"^(\w+(?:\.\w+)+) (?:==|!=) -?[\d.]+$", guard)
    if m:
        attr = m[1]
        written = re.search(rf"^\s*{re.escape(attr)}\s*([-+*/]?=)", code or "")
        where = "forward changes it on this line" if written else "it changed between calls"
        return MODULE_ATTRIBUTE, (
            f"`{attr}` is a Python number kept on the module (not an argument); {where}, and torch bakes "
            "attributes into the graph as constants, so each new value recompiles, up to "
            "torch._dynamo.config.recompile_limit, then forward runs eagerly. Keep it as a tensor buffer "
            f"(`self.register_buffer(\"{attr.split('.')[-1]}\", torch.zeros((), dtype=torch.long))`, updated in "
            "place), or update "
            "it outside forward and pass the value in as a tensor.")
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
        "A guard on this value failed; see the guard text (torch's own): `TORCH_LOGS=recompiles_verbose` shows "
        "every guard that failed. Make what the guard checks the same on every call."
    )
