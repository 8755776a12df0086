"""Tensor-core friendly shapes: matmul and convolution dims that are not multiples of 8.

NVIDIA's guidance (Deep Learning Performance Guide, "Matrix multiplication" and "Convolutions"):
fp16/bf16 tensor cores need the M, N, K dims of a GEMM (features, channels, batch x tokens) to be
multiples of 8 elements (16 bytes), TF32 multiples of 4; multiples of 64-128 are best, and a
vocabulary is worth padding to a multiple of 64. cuBLAS falls back to slower kernels otherwise.

The check records each Linear and Conv layer's GEMM shape during one forward pass, then, for
each misaligned shape, times the layer's training GEMMs (forward, input gradient, weight gradient)
at its shape and padded up to multiples of 8, interleaved, on this device and dtype: padding does
more FLOPs, so only a measurement says whether it pays here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kiln.advise.findings import Finding, saved
from kiln.timing import measure_interleaved

ALIGN = 8
MAX_MEASURED = 8
"""Misaligned shapes measured (the largest by FLOPs); the rest are listed unmeasured."""


def _up(n: int, multiple: int = ALIGN) -> int:
    return -(-n // multiple) * multiple


@dataclass
class Gemm:
    kind: str
    """`linear` or `convNd`."""
    names: list[str]
    m: int
    """Rows: batch x tokens (linear), batch x output pixels (conv)."""
    k: int
    """Reduction: in_features, or in_channels/groups x kernel volume."""
    n: int
    """Columns: out_features / out_channels."""
    count: int = 1
    input_shape: tuple[int, ...] = ()
    layer: nn.Module | None = None

    @property
    def misaligned(self) -> dict[str, int]:
        dims = {"M (batch x tokens)": self.m, "K (input features)": self.k, "N (output features)": self.n}
        if self.kind.startswith("conv"):
            dims = {"batch x pixels": self.m, "input channels": self.layer.in_channels // self.layer.groups,
                    "output channels": self.n}
        return {name: v for name, v in dims.items() if v % ALIGN}

    @property
    def flops(self) -> int:
        return 6 * self.m * self.k * self.n * self.count  # forward + two backward GEMMs


def collect_gemms(module: nn.Module, inputs: tuple[Any, ...], call: Callable[[], Any]) -> list[Gemm]:
    """GEMM shapes of every Linear and Conv layer, seen in one call of `call()`; layers of the same
    shape are merged (`count`)."""
    seen: dict[tuple, Gemm] = {}
    handles = []

    def hook(name: str, layer: nn.Module):
        def record(mod, args, output):
            x = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if x is None:
                return
            if isinstance(mod, nn.Linear):
                key = ("linear", x.numel() // mod.in_features, mod.in_features, mod.out_features)
            else:
                out_pixels = output.numel() // (output.shape[0] * output.shape[1]) if output.dim() > 2 else 1
                kernel = math.prod(mod.kernel_size)
                key = (f"conv{len(mod.kernel_size)}d", x.shape[0] * out_pixels, mod.in_channels // mod.groups * kernel,
                       mod.out_channels, tuple(x.shape), tuple(mod.kernel_size), mod.stride, mod.padding, mod.groups)
            if key in seen:
                seen[key].count += 1
                if name not in seen[key].names:
                    seen[key].names.append(name)
            else:
                seen[key] = Gemm(key[0], [name], key[1], key[2], key[3], 1, tuple(x.shape), mod)
        return record

    for name, layer in module.named_modules():
        if isinstance(layer, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            handles.append(layer.register_forward_hook(hook(name or type(layer).__name__, layer)))
    try:
        with torch.no_grad():
            call()
    finally:
        for handle in handles:
            handle.remove()
    return list(seen.values())


def _linear_fn(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device) -> Callable[[], None]:
    x = torch.randn(m, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=dtype)
    dy = torch.randn(m, n, device=device, dtype=dtype)

    def step() -> None:
        torch.mm(x, w.t())   # forward
        torch.mm(dy, w)      # input gradient
        torch.mm(dy.t(), x)  # weight gradient

    return step


def _conv_fn(g: Gemm, pad_channels: bool, dtype: torch.dtype, device: torch.device) -> Callable[[], None]:
    layer = g.layer
    dims = len(layer.kernel_size)
    conv = getattr(torch.nn.functional, f"conv{dims}d")
    grad_input = getattr(torch.nn.grad, f"conv{dims}d_input")
    grad_weight = getattr(torch.nn.grad, f"conv{dims}d_weight")
    cin, cout = layer.in_channels, layer.out_channels
    if pad_channels:
        cin, cout = _up(cin // layer.groups) * layer.groups, _up(cout)
    shape = (g.input_shape[0], cin, *g.input_shape[2:])
    x = torch.randn(shape, device=device, dtype=dtype)
    w = torch.randn(cout, cin // layer.groups, *layer.kernel_size, device=device, dtype=dtype)
    kw = {"stride": layer.stride, "padding": layer.padding, "dilation": layer.dilation, "groups": layer.groups}
    y = conv(x, w, **kw)
    dy = torch.randn_like(y)

    def step() -> None:
        conv(x, w, **kw)
        grad_input(x.shape, w, dy, **kw)
        grad_weight(x, w.shape, dy, **kw)

    return step


def time_padding(g: Gemm, dtype: torch.dtype, device: torch.device, repeats: int = 30) -> tuple[float, float]:
    """Median seconds of the layer's three training GEMMs at its shape and padded to multiples of 8."""
    if g.kind == "linear":
        sides = {"as_is": _linear_fn(g.m, g.k, g.n, dtype, device),
                 "padded": _linear_fn(_up(g.m), _up(g.k), _up(g.n), dtype, device)}
    else:
        sides = {"as_is": _conv_fn(g, False, dtype, device), "padded": _conv_fn(g, True, dtype, device)}
    timings = measure_interleaved(sides, warmup=3, repeats=repeats, device=device)
    return timings["as_is"].median_s, timings["padded"].median_s


def _fix(g: Gemm) -> str:
    names = ", ".join(g.names[:3]) + (f" (+{len(g.names) - 3} more)" if len(g.names) > 3 else "")
    parts = []
    for dim, value in g.misaligned.items():
        if dim.startswith(("M ", "batch")):
            parts.append(f"batch x tokens {value} -> {_up(value)} (data.batch_size / data.seq_len)")
        else:
            parts.append(f"{dim} {value} -> {_up(value)}")
    return f"{names}: " + "; ".join(parts)


def check_alignment(gemms: list[Gemm], *, dtype: torch.dtype, device: torch.device, measure: bool,
                    step_s: float | None = None) -> Finding:
    title = "tensor-core shapes (dims multiple of 8)"
    bad = sorted((g for g in gemms if g.misaligned), key=lambda g: -g.flops)
    if not gemms:
        return Finding("alignment", title, "n/a", "no Linear or Conv layers were called in a forward pass")
    if not bad:
        return Finding("alignment", title, "ok", f"all {sum(g.count for g in gemms)} Linear/Conv layers have GEMM dims "
                       f"that are multiples of {ALIGN}")
    details = []
    total_before = total_after = 0.0
    for i, g in enumerate(bad):
        item = {"layers": g.names, "kind": g.kind, "count": g.count, "m": g.m, "k": g.k, "n": g.n,
                "misaligned": g.misaligned, "fix": _fix(g)}
        if measure and i < MAX_MEASURED:
            before, after = time_padding(g, dtype, device)
            item.update(as_is_ms=before * 1e3, padded_ms=after * 1e3, extra_flops_frac=(
                _up(g.m) * _up(g.k) * _up(g.n) / (g.m * g.k * g.n) - 1))
            total_before += before * g.count
            total_after += after * g.count
        details.append(item)
    layers = sum(g.count for g in bad)
    finding = (f"{layers} layer(s) in {len(bad)} shape(s) have dims that are not multiples of {ALIGN}: "
               + "; ".join(f"{g.names[0]} {g.kind} M={g.m} K={g.k} N={g.n}" for g in bad[:4])
               + (" ..." if len(bad) > 4 else ""))
    fix = ("pad to multiples of 8 (16+ is better, 64 for a vocabulary): " + " | ".join(d["fix"] for d in details[:4])
           + ("" if len(details) <= 4 else " | ..."))
    if not measure or total_before == 0:
        return Finding("alignment", title, "advice", finding, fix, details=details)
    gain, frac = saved(total_before, total_after, per="step (these layers' GEMMs)")
    measured = {"gemm_ms_as_is": total_before * 1e3, "gemm_ms_padded": total_after * 1e3,
                "dtype": str(dtype).removeprefix("torch."), "device": str(device)}
    if step_s:
        measured["share_of_step"] = (total_before - total_after) / step_s
        gain += f"; {(total_before - total_after) / step_s:+.1%} of a {step_s * 1e3:.3g} ms eager step"
    status = "advice" if frac > 0.02 else "info"
    if status == "info":
        fix = f"padding measured no faster on {device.type} in {measured['dtype']}: leave the shapes (" + fix + ")"
    return Finding("alignment", title, status, finding, fix, gain, frac, measured, details)
