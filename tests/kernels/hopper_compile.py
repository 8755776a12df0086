"""Compiling a kiln Triton kernel for an H100/H200 (sm_90) on a machine without a GPU: Triton's
frontend, its NVIDIA passes and the ptxas it ships run on the CPU. The interpreter the kernel tests
run under checks what a kernel computes, not what compiles: it lets a loop variable change its
integer type, or a 64-bit TMA coordinate, that the GPU compiler refuses."""

from __future__ import annotations

from typing import Any

import pytest


def compile_sm90(fn: Any, types: dict[str, str], constexprs: dict[str, Any], num_warps: int) -> Any:
    """The kernel `fn` (a triton.jit function) compiled for sm_90: `types` gives every runtime
    argument's Triton type ('*bf16', 'i32', 'fp32', 'tensordesc<bf16[64, 128]>'), `constexprs` the
    rest. Skips the test where this Triton build has no NVIDIA backend."""
    import triton
    from triton.compiler import ASTSource

    try:
        from triton.backends.compiler import GPUTarget
        from triton.backends.nvidia import compiler  # noqa: F401  (the backend, with its ptxas)
    except ImportError as exc:
        pytest.skip(f"Triton has no NVIDIA backend here ({exc})")
    names = fn.arg_names
    missing = [n for n in names if n not in types and n not in constexprs]
    if missing:
        raise ValueError(f"no type or value for {missing}")
    signature = {n: types.get(n, "constexpr") for n in names}
    values = {(names.index(n),): v for n, v in constexprs.items()}
    return triton.compile(ASTSource(fn, signature, values), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, "num_stages": 2})
