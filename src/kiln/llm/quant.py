"""Weight-only quantization of kiln's decoder: int8, int4 (group-wise) and nf4.

Batch-1 decode reads every weight once per token, so bytes per weight set its speed ceiling.
`quantize_decoder(model, spec)` returns a quantized copy of the model that shares every tensor
it does not quantize (embedding, norms, biases) with the original, so a benchmark can hold the
bf16 model and its quantized variants at little extra memory. What is quantized: every
projection of every block (`wqkv`, `wo`, `w_gate_up`, `w_down`) and, unless `lm_head=False`, the
output head; a tied head gets its own quantized copy while the input embedding stays in the
model's dtype (a lookup reads one row per token).

Backends (`QuantSpec.backend`):
- `torchao` (default; `pip install 'kiln[quant]'`): `quantize_` with `Int8WeightOnlyConfig`
  (version 2: per-row or `PerGroup`) and `Int4WeightOnlyConfig` (version 2,
  `int4_packing_format="tile_packed_to_4d"`: torch's tinygemm kernel, CUDA sm80+ and bf16 only).
  Only torchao's Python tensor subclasses are used; its C++ extensions (fp8/mx kernels) may
  fail to load against another torch build without harm.
- `torch`: kiln's own layers on torch's ops (kiln.llm.quant_torch): int8 anywhere, int4 through
  torch's tinygemm op on CUDA (bf16) and its CPU int4 kernel on CPU.
- `inductor`: kiln's int4 layer written as plain tensor math, so inductor fuses unpacking and
  dequantization into the decode step's matrix-vector kernels (int8: as `torch`); any device.
- `triton`: kiln's own int4 layout and Triton kernel (kiln.kernels.triton_int4) for decode steps;
  CUDA, fp16/bf16 (int8: as `torch`). Each RMSNorm's weight is folded into the projections that
  read it (W diag(norm_w), quantized as one; the norm keeps weight 1 and `folded`): the same
  model in exact arithmetic, and the kernel's norm becomes one scalar per row. The MLP's gate and
  up rows are stored interleaved, so the kernel can write the SwiGLU itself.
- `gemlite` (`pip install 'kiln[gemlite]'`): gemlite's Triton kernels on the same int4 layout,
  nothing folded (kiln.llm.int4_gemlite); CUDA, fp16/bf16 (int8: as `torch`).
- `auto`: torchao where it is installed and supports the kind on this device, else `torch`.
- nf4 always goes through bitsandbytes (`Linear4bit`, as transformers' `load_in_4bit` does).
Everything a spec cannot do on this device/dtype/model is a ConfigError naming the flag
(`check_quant`), raised before any model is built.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from kiln.errors import ConfigError
from kiln.llm.decoder_config import DecoderConfig
from kiln.llm.families import family_spec, takes_kernel
from kiln.llm.quant_torch import (
    INT4_GROUP_SIZES,
    Int4FusedLinear,
    Int4WeightOnlyLinear,
    Int8WeightOnlyLinear,
    int4_inner_k_tiles,
    int4_reference,
)

QUANT_KINDS = ("none", "int8", "int4", "nf4")
BACKENDS = ("torchao", "torch", "inductor", "triton", "gemlite", "auto")
OWN_INT4 = ("inductor", "triton", "gemlite")
"""Backends whose int4 layer is kiln's plain-byte layout (int8 on them is the `torch` layer)."""
NF4_BLOCK_SIZES = (64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_GROUP = {"int8": None, "int4": 128, "nf4": 64}
"""Group size per kind when none is given: int8 per output channel, int4 128 (gpt-fast's and
torchao's default), nf4 64 (bitsandbytes' block size)."""
INSTALL_TORCHAO = "pip install 'kiln[quant]'"
INSTALL_BNB = "pip install 'kiln[nf4]'"
FLAGS = {"quant": "--quant", "group_size": "--group-size", "backend": "--quant-backend", "dtype": "--dtype"}


@dataclass(frozen=True)
class QuantSpec:
    kind: str = "none"
    """none, int8, int4 or nf4."""
    group_size: int | None = None
    """Input features per scale (int8: None = per output channel; int4: 32/64/128/256; nf4: block size)."""
    backend: str = "torchao"
    """torchao, torch, inductor, triton, gemlite or auto for int8/int4 (nf4 is always bitsandbytes)."""
    lm_head: bool = True
    """Quantize the output head too (the largest single matrix of small Llamas)."""

    @property
    def group(self) -> int | None:
        return self.group_size if self.group_size is not None else DEFAULT_GROUP.get(self.kind)

    @property
    def library(self) -> str | None:
        """What runs it: torchao, torch (kiln's layers), bitsandbytes, or None when unquantized."""
        if self.kind == "none":
            return None
        return "bitsandbytes" if self.kind == "nf4" else self.backend

    def describe(self) -> str:
        if self.kind == "none":
            return "none"
        group = f"g{self.group}" if self.group else "per-channel"
        head = "" if self.lm_head else ", head unquantized"
        return f"{self.kind} ({group}, {self.library}{head})"


def _quiet_import(name: str):
    """Import torchao/bitsandbytes without their import-time log lines (e.g. torchao's warning that
    a C++ extension built for another torch cannot load: kiln does not use those kernels)."""
    import importlib

    # torch.utils._pytree: torch 2.13 warns when torchao registers an Enum as a pytree constant.
    loggers = [logging.getLogger(n) for n in (name, "torchao", "bitsandbytes", "torch.utils._pytree")]
    saved = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        return importlib.import_module(name)
    finally:
        for lg, level in zip(loggers, saved):
            lg.setLevel(level)


def torchao_missing() -> str | None:
    """Why torchao cannot serve kiln (not installed, or too old for its version-2 configs), or None."""
    try:
        _quiet_import("torchao")
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig  # noqa: F401
        from torchao.quantization.quantize_.workflows import Int4PackingFormat
    except ImportError as exc:
        return f"torchao is not installed or too old ({exc}); {INSTALL_TORCHAO}"
    if not hasattr(Int4PackingFormat, "TILE_PACKED_TO_4D"):
        return f"this torchao has no tile_packed_to_4d int4 format (needs >= 0.16); {INSTALL_TORCHAO}"
    return None


def bitsandbytes_missing() -> str | None:
    try:
        _quiet_import("bitsandbytes")
    except Exception as exc:  # a broken native library raises more than ImportError
        return f"bitsandbytes is not installed or does not load ({type(exc).__name__}: {exc}); {INSTALL_BNB}"
    return None


def target_shapes(config: DecoderConfig, lm_head: bool) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of every projection kind quantizes (its family's, and the head)."""
    shapes = dict(family_spec(config.family).projections(config))
    if lm_head:
        shapes["lm_head"] = (config.vocab_size, config.dim)
    return shapes


def _int4_device_problem(device: torch.device, dtype: torch.dtype, backend: str) -> tuple[str, str] | None:
    """(flag, reason) when int4 cannot run on this device/dtype with this backend."""
    if backend == "triton":
        if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
            return "--quant", f"int4@triton runs kiln's Triton kernel: CUDA with fp16/bf16, not {device} {str(dtype)[6:]}"
        try:
            import kiln.llm.int4_layout  # noqa: F401  (its layer and the kernel's op)
        except ImportError as exc:
            return "--quant", f"int4@triton needs Triton, which does not import here ({exc})"
        return None
    if backend == "gemlite":
        try:
            from kiln.llm.int4_gemlite import device_problem  # Triton (and gemlite) are optional
        except ImportError as exc:
            return "--quant", f"int4@gemlite needs Triton, which does not import here ({exc})"
        problem = device_problem(device, dtype)
        return None if problem is None else ("--quant", problem)
    if device.type == "cuda" and backend != "inductor":
        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:
            return "--quant", f"int4 (tinygemm) needs a GPU of compute capability >= 8.0, this one is {major}.{minor}"
        if dtype != torch.bfloat16:
            return "--dtype", f"int4 kernels (tinygemm) take bf16 activations on CUDA, not {str(dtype)[6:]}"
        if not hasattr(torch.ops.aten, "_weight_int4pack_mm"):
            return "--quant", f"torch {torch.__version__} has no aten._weight_int4pack_mm"
        return None
    if backend == "inductor":
        return None
    if backend == "torchao":
        return "--quant", ("int4 through torchao needs CUDA (sm80+) with bf16: its int4 weight-only kernel is "
                           "tinygemm; on this device use --quant-backend torch (torch's CPU int4 kernel), "
                           "inductor, or auto")
    if device.type != "cpu" or not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        return "--quant", f"int4 needs CUDA with bf16 (or torch's CPU int4 kernel); not available on {device}"
    return None


def resolve_backend(kind: str, requested: str, device: torch.device, dtype: torch.dtype) -> str:
    """The backend a kind runs on: `auto` becomes torchao where torchao serves it here, else torch."""
    if kind in ("none", "nf4") or requested != "auto":
        return requested if requested != "auto" else "torch"
    if torchao_missing() is None and not (kind == "int4" and _int4_device_problem(device, dtype, "torchao")):
        return "torchao"
    return "torch"


def parse_quant(entry: str, spec: QuantSpec, key: str = "--quant") -> QuantSpec:
    """`KIND` or `KIND@BACKEND` (one `--quant` entry) over the flags' defaults in `spec`."""
    kind, sep, backend = entry.partition("@")
    if sep and kind in ("none", "nf4"):
        raise ConfigError(key, f"{entry!r}: {kind} takes no backend (nf4 is always bitsandbytes)")
    if sep and backend not in BACKENDS:
        raise ConfigError(key, f"{entry!r}: unknown backend {backend!r}", BACKENDS)
    return replace(spec, kind=kind, backend=backend if sep else spec.backend)


def check_quant(spec: QuantSpec, config: DecoderConfig, device: torch.device | str, dtype: torch.dtype,
                keys: dict[str, str] | None = None) -> QuantSpec:
    """The spec with its backend resolved, or a ConfigError naming the flag at fault. Does not check
    bitsandbytes' presence (a benchmark turns a missing one into a skipped row): `bitsandbytes_missing`."""
    key = {**FLAGS, **(keys or {})}
    device = torch.device(device)
    if spec.kind not in QUANT_KINDS:
        raise ConfigError(key["quant"], f"unknown quantization {spec.kind!r}; a kind may name its backend, e.g. "
                          f"int4@triton (backends: {', '.join(BACKENDS)})", QUANT_KINDS)
    if spec.backend not in BACKENDS:
        raise ConfigError(key["backend"], f"unknown backend {spec.backend!r}", BACKENDS)
    if spec.kind == "none":
        return replace(spec, group_size=None)
    backend = resolve_backend(spec.kind, spec.backend, device, dtype)
    spec = replace(spec, backend="torch" if spec.kind == "int8" and backend in OWN_INT4 else backend)  # same layer
    if spec.library == "torchao":
        reason = torchao_missing()
        if reason:
            raise ConfigError(key["quant"], f"{spec.kind} through torchao: {reason}, or --quant-backend torch "
                              "(kiln's own torch kernels)")
    if spec.kind == "int4" and spec.backend == "triton" and not takes_kernel(config.family, "int4_triton"):
        raise ConfigError(key["quant"], f"int4@triton needs the Llama block's layout, {config.family} models "
                          "have another (another int4 backend serves them)")
    if spec.kind == "int4":
        problem = _int4_device_problem(device, dtype, spec.backend)
        if problem:
            flag, reason = problem
            raise ConfigError(key["dtype"] if flag == "--dtype" else key["quant"], reason,
                              ("bf16",) if flag == "--dtype" else None)
    group = spec.group
    if spec.kind == "int4" and group not in INT4_GROUP_SIZES:
        raise ConfigError(key["group_size"], f"int4 group size must be one the tinygemm kernel takes, got {group}",
                          [str(g) for g in INT4_GROUP_SIZES])
    if spec.kind == "nf4" and group not in NF4_BLOCK_SIZES:
        raise ConfigError(key["group_size"], f"nf4 block size must be one bitsandbytes takes, got {group}",
                          [str(g) for g in NF4_BLOCK_SIZES])
    if spec.kind == "int8" and group is not None and group < 2:
        raise ConfigError(key["group_size"], f"int8 group size must be >= 2 (omit it for per-channel scales), got {group}")
    shapes = target_shapes(config, spec.lm_head)
    if spec.kind in ("int8", "int4") and group:
        bad = {name: k for name, (_, k) in shapes.items() if k % group}
        if bad:
            name, k = next(iter(bad.items()))
            fits = [str(g) for g in (INT4_GROUP_SIZES if spec.kind == "int4" else (32, 64, 128, 256))
                    if all(kk % g == 0 for _, kk in shapes.values())]
            raise ConfigError(key["group_size"], f"{group} does not divide the {k} input features of {name} "
                              "(groups run along the input dimension)", fits or None)
    if spec.kind == "int4":
        if spec.backend == "inductor" and (bad := [n for n, (_, k) in shapes.items() if k % (2 * group)]):
            raise ConfigError(key["group_size"], f"the {spec.backend} int4 layout packs the two halves of the input features "
                              f"into one byte: {bad[0]}'s {shapes[bad[0]][1]} inputs must be a multiple of 2 x {group}")
        if spec.backend == "torch" and device.type == "cuda":
            odd = [(n, s) for n, s in shapes.items() if s[0] % 8 or int4_inner_k_tiles(s[1]) is None]
            if odd:
                raise ConfigError(key["quant"], f"torch's int4 kernel needs out_features % 8 == 0 and in_features % 32 "
                                  f"== 0; {odd[0][0]} is {odd[0][1][0]}x{odd[0][1][1]} (--quant-backend torchao pads)")
    return spec


# -- quantizing -------------------------------------------------------------------------------------

def _targets(model: nn.Module, lm_head: bool) -> Iterator[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, linear) of every projection to quantize (its family's, then the head)."""
    paths = [p.rpartition(".") for p in family_spec(model.config.family).projections(model.config)]
    for block in model.layers:
        for parent_path, _, name in paths:
            parent = block.get_submodule(parent_path)
            yield parent, name, getattr(parent, name)
    if lm_head:
        yield model, "lm_head", model.lm_head


def shallow_copy(model: nn.Module) -> nn.Module:
    """A new module tree holding the very same parameter and buffer tensors (no weight is copied)."""
    memo = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo)


@contextmanager
def _inductor_config_untouched() -> Iterator[None]:
    """torchao's configs may set inductor options globally (`set_inductor_config`); kiln passes it
    False and passes its options per compile, but keep the global config as it was regardless."""
    import torch._inductor.config as inductor_config

    saved = inductor_config.save_config()
    try:
        yield
    finally:
        inductor_config.load_config(saved)


def _torchao(model: nn.Module, spec: QuantSpec) -> None:
    _quiet_import("torchao")
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup, PerRow
    from torchao.quantization.quantize_.workflows import Int4PackingFormat

    if spec.kind == "int8":
        config = Int8WeightOnlyConfig(granularity=PerGroup(spec.group) if spec.group else PerRow(), version=2,
                                      set_inductor_config=False)
    else:
        config = Int4WeightOnlyConfig(group_size=spec.group, int4_packing_format=Int4PackingFormat.TILE_PACKED_TO_4D,
                                      version=2, set_inductor_config=False)
    chosen = {id(linear) for _, _, linear in _targets(model, spec.lm_head)}
    with _inductor_config_untouched():
        quantize_(model, config, filter_fn=lambda module, fqn: id(module) in chosen)


def _bitsandbytes(model: nn.Module, spec: QuantSpec) -> None:
    bnb = _quiet_import("bitsandbytes")
    for parent, name, linear in list(_targets(model, spec.lm_head)):
        weight = linear.weight
        layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=False, compute_dtype=weight.dtype,
                                  compress_statistics=False, quant_type="nf4", quant_storage=torch.uint8,
                                  device="meta")
        # Params4bit quantizes when moved to a device (bitsandbytes' own loading path).
        layer.weight = bnb.nn.Params4bit(weight.detach(), requires_grad=False, blocksize=spec.group,
                                         compress_statistics=False, quant_type="nf4", quant_storage=torch.uint8,
                                         module=layer).to(weight.device)
        layer.bias = linear.bias
        setattr(parent, name, layer)


def _fold(norm: nn.Module) -> Tensor:
    """Marks `norm` folded (weight 1 from now on); returns the weight it had."""
    weight = norm.weight
    norm.weight = nn.Parameter(torch.ones_like(weight), requires_grad=False)
    norm.folded = True
    return weight


def _triton_int4(model: nn.Module, spec: QuantSpec) -> None:
    """int4@triton: every norm folded into the projections after it, gate/up rows interleaved."""
    from kiln.llm.int4_layout import Int4TritonLinear

    group = spec.group
    for block in model.layers:
        attn, ffn = block.attn, block.ffn
        attn.wqkv = Int4TritonLinear.from_linear(attn.wqkv, group, norm_weight=_fold(block.attn_norm))
        attn.wo = Int4TritonLinear.from_linear(attn.wo, group)
        ffn.w_gate_up = Int4TritonLinear.from_linear(ffn.w_gate_up, group, norm_weight=_fold(block.ffn_norm),
                                                     interleave=True)
        ffn.w_down = Int4TritonLinear.from_linear(ffn.w_down, group)
    if spec.lm_head:
        model.lm_head = Int4TritonLinear.from_linear(model.lm_head, group, norm_weight=_fold(model.norm))


def _torch(model: nn.Module, spec: QuantSpec) -> None:
    if spec.kind == "int4" and spec.backend == "triton":
        _triton_int4(model, spec)
        return
    if spec.kind == "int4" and spec.backend == "gemlite":
        from kiln.llm.int4_gemlite import Int4GemliteLinear as int4  # Triton and gemlite are optional
    else:
        int4 = Int4FusedLinear if spec.backend == "inductor" else Int4WeightOnlyLinear
    for parent, name, linear in list(_targets(model, spec.lm_head)):
        if spec.kind == "int8":
            layer = Int8WeightOnlyLinear.from_linear(linear, spec.group)
        else:
            layer = int4.from_linear(linear, spec.group)
        setattr(parent, name, layer)


@torch.no_grad()
def quantize_decoder(model: nn.Module, spec: QuantSpec) -> nn.Module:
    """A quantized copy of `model` (checked spec: `check_quant`); `model` itself is left as it was."""
    if spec.kind == "none":
        return model
    quantized = shallow_copy(model)
    {"torchao": _torchao, "torch": _torch, "inductor": _torch, "triton": _torch, "gemlite": _torch,
     "bitsandbytes": _bitsandbytes}[spec.library](quantized, spec)
    quantized.quant = spec
    return quantized.eval()


def _dequantized_weight(layer: nn.Module, original: nn.Linear, spec: QuantSpec) -> torch.Tensor:
    """The weight a quantized layer stands for, dequantized by the format's own reference code."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    weight = layer.weight
    out_f, in_f = original.weight.shape
    if is_traceable_wrapper_subclass(weight):  # torchao: the tensor subclass dequantizes itself
        try:
            return weight.dequantize()[:out_f, :in_f]
        except (NotImplementedError, RuntimeError, TypeError, AttributeError):
            # torchao's tinygemm tensor has no dequantize: its own matmul of the identity (M = in_features,
            # a different tiling from decode's M = 1) gives the weight as its kernel reads the packing.
            eye = torch.eye(in_f, dtype=original.weight.dtype, device=original.weight.device)
            return torch.nn.functional.linear(eye, weight).t()
    if spec.kind == "nf4":  # bitsandbytes' own rounding, redone (its CPU path repacks the stored data)
        bnb = _quiet_import("bitsandbytes")
        packed, state = bnb.functional.quantize_4bit(original.weight.detach().contiguous(), blocksize=spec.group,
                                                     compress_statistics=False, quant_type="nf4",
                                                     quant_storage=torch.uint8)
        return bnb.functional.dequantize_4bit(packed, state).view(out_f, in_f)
    if isinstance(layer, Int4WeightOnlyLinear):  # tinygemm's tiles are opaque: redo the rounding
        return int4_reference(original, spec.group, layer.scales_and_zeros.dtype)
    return layer.dequantize()


@torch.no_grad()
def dequantized_reference(base: nn.Module, quantized: nn.Module, spec: QuantSpec) -> nn.Module:
    """`base` with every quantized projection replaced by a plain `nn.Linear` holding that layer's
    dequantized weight: the same rounding, computed by ordinary matmuls. The quantized model's
    distance from it is its kernels' error alone, whatever the weights are (random ones included)."""
    reference = shallow_copy(base)
    pairs = zip(_targets(reference, spec.lm_head), _targets(quantized, spec.lm_head))
    for (parent, name, original), (_, _, layer) in pairs:
        plain = nn.Linear(original.in_features, original.out_features, bias=False, device="meta")
        plain.weight = nn.Parameter(_dequantized_weight(layer, original, spec).to(original.weight.dtype),
                                    requires_grad=False)
        plain.bias = original.bias
        setattr(parent, name, plain)
    for name, module in quantized.named_modules():  # norms folded into the weights above (int4@triton)
        if getattr(module, "folded", False):
            folded = reference.get_submodule(name)
            folded.weight, folded.folded = module.weight, True
    return reference.eval()
