"""`--quant int4@gemlite`: Mobius Labs' gemlite Triton kernels (bf16/fp16 activations x 4-bit
weights) over kiln's own int4 layout, no repacking.

gemlite packs uint4 eight to an int32 word along the input dimension, transposed to [K/8, N]
(input 8r+j in bits 4j..4j+3 of word [r, n]): bit for bit kiln.llm.int4_layout's `pack_words`.
Its grouped asymmetric mode (W_group_mode 4: w = fma(q, scale, zero), scale and zero [K/group,
N]) is kiln's `q * scale + offset`, so `Int4GemliteLinear` holds the very tensors an
`Int4TritonLinear` built without folding holds and passes them to gemlite's op through
`kiln::gemlite_int4` (a torch custom op with a fake implementation: torch.compile and CUDA graphs
take it as one opaque call). gemlite picks its kernel by rows (GEMV split-K up to 4 rows, GEMM
split-K below 64, GEMM above) unless a layer names one (`GemliteKernel`). Above `GEMLITE_UP_TO`
rows (prefill) the layer takes int4@triton's prefill path instead, the weight dequantized once
(kiln.kernels.triton_int4_dequant) and the dense matmul: gemlite's autotuner keys on the exact row
count, so every new prompt length would autotune again.

gemlite is optional (`pip install 'kiln[gemlite]'`) and imported on first use: it queries the
CUDA device while importing, so it never imports on a machine without one. It ships launch
settings per GPU (its configs/*.json, chosen by the GPU's name); a GPU without a table of its own
gets its sibling's (`SIBLING_CONFIGS`), and a shape outside the table is autotuned on its first
call, which must therefore come before any CUDA graph capture (kiln's warm-up does that).
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kiln.llm.int4_layout import Int4TritonLinear, dequant_linear, unpack_words

GemliteKernel = Literal["auto", "GEMV", "GEMV_REVSPLITK", "GEMV_SPLITK", "GEMM_SPLITK", "GEMM"]
GEMLITE_KERNELS: tuple[GemliteKernel, ...] = ("auto", "GEMV", "GEMV_REVSPLITK", "GEMV_SPLITK", "GEMM_SPLITK", "GEMM")
"""`auto` (gemlite's choice by rows), then gemlite's matmul types in the order of its
`GEMLITE_MATMUL_TYPES`: a named kernel is passed to its op as its index there."""
INSTALL_GEMLITE = "pip install 'kiln[gemlite]'"
SIBLING_CONFIGS = {"h200": "h100", "h800": "h100", "h20": "h100"}
"""GPU name fragment -> the gemlite config table it uses when gemlite ships none of its own (the same
architecture, so the same tile shapes fit; only the bandwidth differs)."""

GEMLITE_FROM = 8
"""Rows from which gemlite's kernels take over from kiln's one-row kernel (slower at 1 and 4 rows
where measured)."""
GEMLITE_UP_TO = 64
"""Rows up to which gemlite's kernels multiply (decode batches); more take the dequantized weight."""

_GEMLITE_DTYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
"""torch dtype -> gemlite's DType value (gemlite.dtypes.DType: FP32 0, FP16 1, BF16 2)."""


def meta_args(group_size: int, dtype: torch.dtype) -> list[int]:
    """gemlite's meta arguments for kiln's layout (`GemLiteLinearTriton.get_meta_args`'s order):
    no activation scaling, 4 bits, `group_size`, unpack mask 15, 8 values per int32 word, input,
    output and scale dtype `dtype`, fp32 accumulation, no channel scale, W_group_mode 4
    (q * scale + zero), weight contiguous."""
    dt = _GEMLITE_DTYPE[dtype]
    return [0, 4, group_size, 15, 8, dt, dt, _GEMLITE_DTYPE[torch.float32], dt, 0, 4, 1]


def kernel_index(kernel: GemliteKernel) -> int:
    """The `matmul_type` gemlite's op takes: -1 for its own choice, else the kernel's index."""
    return GEMLITE_KERNELS.index(kernel) - 1


def device_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why int4@gemlite cannot run on this device/dtype (for a ConfigError naming --quant), or None."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return f"int4@gemlite runs gemlite's Triton kernels: CUDA with fp16/bf16, not {device} {str(dtype)[6:]}"
    missing = gemlite_missing()
    return None if missing is None else f"int4@gemlite: {missing}"


def gemlite_missing() -> str | None:
    """Why gemlite cannot run here (not installed, no CUDA device, an unexpected version), or None."""
    if not torch.cuda.is_available():
        return "gemlite's kernels need a CUDA GPU, and gemlite queries one when it is imported"
    try:
        load_gemlite()
    except Exception as exc:  # gemlite's import runs CUDA and Triton queries: more than ImportError
        return f"gemlite does not import here ({type(exc).__name__}: {exc}); {INSTALL_GEMLITE}"
    return None


def load_gemlite():
    """gemlite, imported quietly, its launch-settings table loaded (a sibling's where it ships none
    for this GPU); raises ImportError when its kernel order is not the one kiln indexes."""
    logger = logging.getLogger("gemlite")
    level = logger.level
    logger.setLevel(logging.ERROR)  # its import logs which config table it loaded
    try:
        gemlite = importlib.import_module("gemlite")
    finally:
        logger.setLevel(level)
    core = gemlite.core
    if list(core.GEMLITE_MATMUL_TYPES) != list(GEMLITE_KERNELS[1:]):
        raise ImportError(f"gemlite {gemlite.__version__} orders its kernels {core.GEMLITE_MATMUL_TYPES}, "
                          f"kiln expects {list(GEMLITE_KERNELS[1:])}")
    if core.selected_tag is None:
        name = torch.cuda.get_device_name().lower()
        sibling = next((s for frag, s in SIBLING_CONFIGS.items() if frag in name), None)
        table = None if sibling is None else Path(core.__file__).parent / "configs" / f"{sibling}.json"
        if table is not None and table.exists() and gemlite.load_config(str(table)):
            core.selected_tag = str(table)
    return gemlite


def config_table() -> str | None:
    """The gemlite launch-settings table in use (a path), or None when every shape autotunes."""
    return load_gemlite().core.selected_tag


_TUNED: set[tuple] = set()
"""(rows, weight shape, group, kernel, dtype) keys gemlite has been called with. A key's first call
autotunes, and autotuning reruns a split-K kernel into that call's output (it adds, so the output
is a multiple): `gemlite_int4` makes a key's first call twice and returns the second."""


@torch.library.custom_op("kiln::gemlite_int4", mutates_args=())
def gemlite_int4(x: Tensor, weight: Tensor, scale: Tensor, offset: Tensor, meta_scale: Tensor, group_size: int,
                 kernel: int) -> Tensor:
    """x [M, K] @ the int4 weight (kiln's layout) through gemlite's op; `kernel`: `kernel_index`."""
    tensors, meta = [weight, scale, offset, meta_scale], meta_args(group_size, x.dtype)
    key = (x.shape[0], *weight.shape, group_size, kernel, x.dtype)
    if key not in _TUNED and not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
        torch.ops.gemlite.forward_functional(x, None, tensors, meta, kernel)
        _TUNED.add(key)
    return torch.ops.gemlite.forward_functional(x, None, tensors, meta, kernel)


@gemlite_int4.register_fake
def _(x: Tensor, weight: Tensor, scale: Tensor, offset: Tensor, meta_scale: Tensor, group_size: int,
      kernel: int) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[1])


def gemlite_path(rows: int, kernel: GemliteKernel) -> Literal["matvec", "gemlite", "dequant"]:
    """Which kernel an `Int4GemliteLinear` on CUDA multiplies `rows` rows with (its docstring)."""
    if rows > GEMLITE_UP_TO:
        return "dequant"
    return "matvec" if rows < GEMLITE_FROM and kernel == "auto" else "gemlite"


class Int4GemliteLinear(nn.Module):
    """kiln's int4 layout (module docstring), multiplied on CUDA below GEMLITE_FROM rows by kiln's
    one-row kernel (kiln::int4_matvec on the same tensors: faster than gemlite's GEMV kernels at 1
    and 4 rows, and closer to the fp32 product, where measured), up to `GEMLITE_UP_TO` rows by
    gemlite's kernels (`kernel`: gemlite's choice by rows, or one named, which also takes the rows
    below), by the dequantized weight above; off CUDA the weight is dequantized in torch."""

    def __init__(self, packed: Tensor, scale: Tensor, offset: Tensor, bias: Tensor | None, *, group_size: int,
                 kernel: GemliteKernel = "auto"):
        super().__init__()
        self.in_features, self.out_features = 8 * packed.shape[0], packed.shape[1]
        self.group_size, self.kernel = group_size, kernel
        self.register_buffer("weight", packed)  # int32 [in/8, out]
        self.register_buffer("scale", scale)  # [in/group, out]: w = q * scale + offset
        self.register_buffer("offset", offset)
        self.register_buffer("meta_scale", torch.zeros((), dtype=torch.float32, device=packed.device))
        self.bias = bias

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, group_size: int, kernel: GemliteKernel = "auto") -> Int4GemliteLinear:
        """Quantizes `linear`'s weight: asymmetric 4-bit groups of `group_size` inputs (min/max)."""
        if linear.weight.is_cuda:
            load_gemlite()  # registers gemlite's op
        own = Int4TritonLinear.from_linear(linear, group_size)  # the same rounding and words, nothing folded
        return cls(own.weight, own.scale, own.offset, linear.bias, group_size=group_size, kernel=kernel)

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        """The weight [out, in] the layer computes with, in `dtype`."""
        dtype = dtype or self.scale.dtype
        q = unpack_words(self.weight).to(dtype).view(self.out_features, -1, self.group_size)
        w = q * self.scale.t().to(dtype)[..., None] + self.offset.t().to(dtype)[..., None]
        return w.view(self.out_features, self.in_features)

    def forward(self, x: Tensor) -> Tensor:
        if not x.is_cuda:
            return F.linear(x, self.dequantize(x.dtype), self.bias)
        flat = x.reshape(-1, self.in_features)
        path = gemlite_path(flat.shape[0], self.kernel)
        if path == "dequant":
            y = dequant_linear(flat, self.weight, self.scale, self.offset, self.group_size)
        elif path == "matvec":
            y = torch.ops.kiln.int4_matvec(flat, self.weight, self.scale, self.offset, self.group_size)
        else:
            y = torch.ops.kiln.gemlite_int4(flat, self.weight, self.scale, self.offset, self.meta_scale,
                                            self.group_size, kernel_index(self.kernel))
        y = y.view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        kernel = "" if self.kernel == "auto" else f", kernel={self.kernel}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, int4 gemlite "
                f"group_size={self.group_size}{kernel}")
