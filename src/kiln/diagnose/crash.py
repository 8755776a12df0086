"""Why a compile stage crashed, when the cause is a custom op: which op, where the user calls it, and the fix.

Inductor plans buffers from each op's fake (meta) output, so a custom op whose fake implementation
reports another shape, strides or dtype than its real kernel fails at run time inside inductor's generated code
(`assert_size_stride`), far from the user's line; the `*_crossref` backends run every op on fake
and real tensors and fail where they disagree; an op without any fake implementation fails at
trace time. torch's own advice (`torch.library.opcheck`, `register_fake`) is kept verbatim.
"""

from __future__ import annotations

import re
from typing import Any

import torch

_OP_PATTERNS = (
    re.compile(r"Error in op: torch\.ops\.(?P<ns>\w+)\.(?P<name>\w+)\.\w+"),
    re.compile(r"output of (?P<ns>\w+)\.(?P<name>\w+)\.\w+ on FakeTensor"),
    re.compile(r"no fake impl registered for <CustomOpDef\((?P<ns>\w+)::(?P<name>\w+)\)>"),
    re.compile(r"call_function (?P<ns>\w+)\.(?P<name>\w+)\.\w+\("),
)
_ADVICE = re.compile(r"opcheck|register_fake|fake \(aka meta\)|This error most often|library\.html|Please use `")
_STRIDE_PAIR = re.compile(r"stride (\d+)==(\d+) at dim=(\d+)")
_SIZE_STRIDE = re.compile(r"size (\d+)==(\d+), stride (\d+)==(\d+) at dim=(\d+)")
_CROSSREF_STRIDES = re.compile(r"Strides are (\([\d, ]*\)) and (\([\d, ]*\))")
_CROSSREF_SHAPES = re.compile(r"Shapes (?:torch\.Size\()?(\[[\d, ]*\])\)? and (?:torch\.Size\()?(\[[\d, ]*\])\)? are not equal")
_CROSSREF_DTYPES = re.compile(r"Dtypes (torch\.\w+) and (torch\.\w+) are not equal")
NO_FAKE_IMPL = "no fake implementation"
FAKE_MISMATCH = "fake implementation disagrees with the kernel"
CUSTOM_OP = "custom op"
CRASH_KINDS = (NO_FAKE_IMPL, FAKE_MISMATCH, CUSTOM_OP)
CROSSREF_MEANING = (
    "the *_crossref stage runs every op on fake tensors (shapes, dtypes and strides only, what the compiler "
    "plans with) and on real tensors, and compares them: a failure there means an op's fake (meta) "
    "implementation disagrees with what its real kernel returns"
)


def error_text(exc: BaseException) -> str:
    """The exception's message and its causes' (torch wraps the real error)."""
    parts, seen = [], set()
    err: BaseException | None = exc
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        parts.append(f"{type(err).__name__}: {err}")
        err = err.__cause__ or err.__context__
    return "\n".join(parts)


def custom_op(text: str) -> str | None:
    """`namespace::name` of a non-aten op the error is about, or None."""
    for pattern in _OP_PATTERNS:
        m = pattern.search(text)
        if m and m["ns"] not in ("aten", "prims", "_c10d_functional", "inductor"):
            return f"{m['ns']}::{m['name']}"
    return None


def torch_advice(text: str) -> list[str]:
    """torch's own lines of advice from the error, in order, without duplicates."""
    out: list[str] = []
    for line in text.splitlines():
        s = re.sub(r"^(\w+(Error|Exception)|Explanation): ", "", line.strip())
        # torch's wrappers quote the inner error: keep the shortest line that carries the words.
        if not s or not _ADVICE.search(s) or any(kept in s for kept in out):
            continue
        out = [kept for kept in out if s not in kept] + [s]
    return out


def _schema_args(op: str) -> tuple[list[str], str | None]:
    """(argument names, the first tensor argument) of a registered op; ([], None) if unknown."""
    ns, name = op.split("::")
    try:
        schema = getattr(getattr(torch.ops, ns), name).default._schema
    except (AttributeError, RuntimeError):
        return [], None
    names = [a.name for a in schema.arguments]
    first_tensor = next((a.name for a in schema.arguments if str(a.type) == "Tensor"), None)
    return names, first_tensor


def fake_impl_example(op: str) -> str:
    """A fake implementation to start from, with the op's own argument names."""
    names, first = _schema_args(op)
    body = (f"torch.empty_like({first})  # same shape, dtype and strides as the real output, no data" if first
            else "...  # return empty tensors shaped like the real outputs")
    return f'@torch.library.register_fake("{op}")\ndef _({", ".join(names)}):\n    return {body}'


def _mismatch(text: str) -> tuple[str, str]:
    """(what differs: `shape`, `strides` or `dtype`, a note with both values) from inductor's
    `assert_size_stride` (`expected size R==F, stride R==F at dim=d`, the real kernel's value first)
    or the crossref check (`Shapes A and B are not equal`, `Strides are A and B`)."""
    dims = [tuple(int(v) for v in m) for m in _SIZE_STRIDE.findall(text)]
    if dims:
        sizes = [f"dim {d[4]}: {d[0]} in the real output, {d[1]} in the fake" for d in dims if d[0] != d[1]]
        if sizes:
            return "shape", f" (size at {'; '.join(sizes)})"
        if any(d[2] != d[3] for d in dims):
            real, fake = tuple(d[2] for d in dims), tuple(d[3] for d in dims)
            return "strides", f" (the real kernel returned strides {real}, the fake implementation said {fake})"
    pairs = _STRIDE_PAIR.findall(text)
    if pairs:
        real = tuple(int(a) for a, _, _ in pairs)
        fake = tuple(int(b) for _, b, _ in pairs)
        return "strides", f" (the real kernel returned strides {real}, the fake implementation said {fake})"
    for what, pattern in (("shape", _CROSSREF_SHAPES), ("strides", _CROSSREF_STRIDES), ("dtype", _CROSSREF_DTYPES)):
        m = pattern.search(text)
        if m:
            return what, f" ({what} {m[1]} vs {m[2]})"
    return "metadata", ""


_DIFFERENT = {"shape": "a different shape", "strides": "different strides", "dtype": "a different dtype",
              "metadata": "other metadata"}
_MISMATCH_FIX = {
    "shape": "make the fake implementation compute the output shape the kernel returns (e.g. "
             "`x.new_empty((x.shape[0] // 2, x.shape[1]))` for a kernel that halves the rows, not `torch.empty_like(x)` "
             "when the shape changes)",
    "strides": "make the fake implementation return the strides the kernel returns (e.g. `torch.empty_like(x)` when "
               "the kernel returns a contiguous tensor like x, not `torch.empty_strided` with other strides)",
    "dtype": "make the fake implementation return the kernel's dtype (`dtype=` of the real output)",
    "metadata": "make the fake implementation return exactly what the kernel returns (shape, dtype and strides)",
}


def explain_crash(exc: BaseException, stage: str) -> dict[str, Any] | None:
    """diagnosis, fix, op and torch's advice for a crash caused by a custom op; None otherwise."""
    text = error_text(exc)
    op = custom_op(text)
    if op is None:
        return None
    advice = torch_advice(text)
    opcheck = f"check it with `torch.library.opcheck(torch.ops.{op.replace('::', '.')}.default, example_args)`"
    if "no fake impl registered" in text or "There was no fake impl" in text:
        return {"op": op, "kind": NO_FAKE_IMPL, "torch_advice": advice,
                "diagnosis": f"custom op `{op}` has no fake implementation, so torch.compile cannot trace it "
                             "(it needs the output's shape, dtype and strides without running the kernel)",
                "fix": f"register one next to the op, then {opcheck}:\n{fake_impl_example(op)}"}
    crossref = stage.endswith("_crossref")
    if crossref or "assert_size_stride" in text or "expected size" in text or "mismatched tensor metadata" in text:
        where = (f"stage {stage}: {CROSSREF_MEANING}" if crossref else
                 "inductor planned its buffers from the op's fake output, and the real output does not match")
        what, note = _mismatch(text)
        return {"op": op, "kind": FAKE_MISMATCH, "torch_advice": advice, "mismatch": what,
                "diagnosis": f"custom op `{op}`: its fake implementation reports {_DIFFERENT[what]} than its real "
                             f"kernel returns{note}; {where}",
                "fix": f"{_MISMATCH_FIX[what]}; {opcheck}"}
    return {"op": op, "kind": CUSTOM_OP, "torch_advice": advice,
            "diagnosis": f"the failure is in custom op `{op}`", "fix": opcheck}
