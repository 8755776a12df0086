"""The torch call to write instead of a NumPy or Python `random` call that torch.compile cannot trace.

The fix hint for such a graph break names the replacement for the function on the user's line,
so the user does not have to look it up; functions not listed get the general advice.
"""

from __future__ import annotations

import re

NUMPY_TO_TORCH = {
    "digitize": "`torch.bucketize(x, bins, right=True)` (equals `np.digitize(x, bins)` for increasing bins)",
    "searchsorted": "`torch.searchsorted(sorted_seq, values)`",
    "histogram": "`torch.histc(x, bins, min, max)` (or `torch.histogram` on CPU)",
    "percentile": "`torch.quantile(x, q / 100)`",
    "quantile": "`torch.quantile(x, q)`",
    "interp": "`torch.searchsorted` for the interval, then `torch.lerp` between its ends",
    "unique": "`torch.unique(x)`",
    "argwhere": "`torch.nonzero(x)`",
    "nonzero": "`torch.nonzero(x, as_tuple=True)`",
    "where": "`torch.where(cond, a, b)`",
    "clip": "`torch.clamp(x, lo, hi)`",
    "pad": "`torch.nn.functional.pad(x, pad)`",
    "convolve": "`torch.nn.functional.conv1d`",
    "packbits": "bit arithmetic on an integer tensor (`(bits << torch.arange(7, -1, -1)).sum(-1)`)",
    "unpackbits": "`(x.unsqueeze(-1) >> torch.arange(7, -1, -1)) & 1`",
    "random.rand": "`torch.rand(shape)`",
    "random.random": "`torch.rand(shape)`",
    "random.uniform": "`torch.empty(shape).uniform_(low, high)`",
    "random.randn": "`torch.randn(shape)`",
    "random.normal": "`torch.normal(mean, std, shape)`",
    "random.randint": "`torch.randint(low, high, shape)`",
    "random.choice": "`torch.multinomial(weights, n)` or `values[torch.randint(len(values), shape)]`",
    "random.permutation": "`torch.randperm(n)`",
    "random.shuffle": "`x[torch.randperm(len(x))]`",
}
RANDOM_TO_TORCH = {
    "random": "`torch.rand(())` (a 0-d tensor in [0, 1))",
    "uniform": "`torch.empty(()).uniform_(a, b)`",
    "randint": "`torch.randint(a, b + 1, ())`",
    "randrange": "`torch.randint(start, stop, ())`",
    "gauss": "`torch.randn(()) * sigma + mu`",
    "normalvariate": "`torch.randn(()) * sigma + mu`",
    "choice": "`values[torch.randint(len(values), ())]`",
    "shuffle": "`x[torch.randperm(len(x))]`",
    "sample": "`torch.randperm(n)[:k]`",
    "betavariate": "`torch.distributions.Beta(a, b).sample()`",
    "expovariate": "`torch.empty(()).exponential_(lambd)`",
}

_NUMPY_CALL = re.compile(r"\b(?:np|numpy)\.((?:random\.|linalg\.|fft\.)?\w+)\(")
_NUMPY_IN_REASON = re.compile(r"numpy function <function (\w+) at")
RANDOM_CALL = re.compile(r"(?<![\w.])random\.(\w+)\(")


def numpy_function(reason: str, code: str) -> str | None:
    """The NumPy function a break is about: the one torch names, else the first on the line."""
    m = _NUMPY_IN_REASON.search(reason or "")
    calls = _NUMPY_CALL.findall(code or "")
    if m:
        name = m[1]
        return next((c for c in calls if c.split(".")[-1] == name), name)
    return calls[0] if calls else None


def numpy_advice(reason: str, code: str) -> str:
    name = numpy_function(reason, code)
    if name is None:
        return ""
    torch_call = NUMPY_TO_TORCH.get(name)
    if torch_call is None:
        return f"`np.{name}` is not traced: write it with torch ops on the tensor itself (no `.numpy()` round trip). "
    return f"Replace `np.{name}` with {torch_call} on the tensor itself (no `.numpy()` round trip). "


def random_advice(code: str) -> str:
    m = RANDOM_CALL.search(code or "")
    name = m[1] if m else "random"
    torch_call = RANDOM_TO_TORCH.get(name, "the matching `torch.rand*` call")
    return (f"Replace `random.{name}()` with {torch_call}: torch traces it into the graph and it follows "
            "`torch.manual_seed`. ")
