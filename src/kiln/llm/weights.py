"""Building a Decoder: random weights (presets, configs) or a checkpoint's safetensors mapped onto it.

The mapping between kiln's parameter names and a checkpoint's Hugging Face names is the family's
(`FamilySpec.hf_names`, kiln.llm.families; the Llama family's table is in kiln.llm.llama_family):
several HF tensors may be concatenated into one fused kiln parameter, and `to_hf_state_dict`
splits them back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from kiln.errors import ConfigError
from kiln.llm.config import ModelSource, config_from_dict, has_weights
from kiln.llm.decoder_config import DecoderConfig
from kiln.llm.families import FAMILIES, family_spec
from kiln.llm.model import Decoder

INSTALL_HINT = "pip install 'kiln[llm]'"
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Buffers some checkpoints carry that kiln recomputes.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def hf_names(config: DecoderConfig) -> dict[str, tuple[str, ...]]:
    """kiln parameter name -> the HF tensor names it is made of (concatenated in this order): the
    name map of the config's family."""
    return family_spec(config.family).hf_names(config)


def to_hf_state_dict(tensors: dict[str, Tensor], config: DecoderConfig) -> dict[str, Tensor]:
    """kiln's decoder tensors (a state dict) under HF's names, fused projections split back into
    q/k/v and gate/up; each tensor its own contiguous copy (safetensors stores no shared views).
    The inverse of `load_hf_tensors`; an output head tied to the embedding is left out."""
    split = family_spec(config.family).hf_splits(config)
    out: dict[str, Tensor] = {}
    for kiln_name, parts in hf_names(config).items():
        if kiln_name not in tensors:
            raise ConfigError("RUN_DIR", f"the checkpoint lacks {kiln_name}: not a {config.family} decoder of this config")
        value = tensors[kiln_name]
        if len(parts) == 1:
            out[parts[0]] = value.contiguous().clone()
            continue
        sizes = split[kiln_name.split(".")[-2]]
        for name, piece in zip(parts, value.split(sizes, dim=0), strict=True):
            out[name] = piece.contiguous().clone()
    return out


def kiln_layout(tensors: dict[str, Tensor], raw: dict[str, Any], key: str = "RUN_DIR") -> DecoderConfig | None:
    """The DecoderConfig of `tensors` when they are a kiln decoder's state dict of the family `raw`
    (config.json fields) names (a name only kiln's side of its name map has among them), else None:
    e.g. an `hf:` run's state dict, already under HF's names."""
    spec = FAMILIES.get(raw.get("model_type"))
    if spec is None:
        return None
    try:
        config = spec.parse_config(raw, key)
    except ConfigError:  # a config kiln's decoder does not run: an hf: model's
        return None
    names = spec.hf_names(config)
    kiln_only = names.keys() - {n for parts in names.values() for n in parts}
    return None if kiln_only.isdisjoint(tensors) else config


def empty_decoder(config: DecoderConfig, *, device: torch.device | str, dtype: torch.dtype) -> Decoder:
    """A Decoder with uninitialised weights on `device` (built on the meta device: no host copy)."""
    with torch.device("meta"):
        model = family_spec(config.family).build(config).to(dtype)  # dtype first, on meta: free; then one allocation each
    model = model.to_empty(device=device)
    if config.tie_embeddings:  # to_empty keeps the tie (same Parameter), but make it explicit
        model.lm_head.weight = model.embed.weight
    return model.eval().requires_grad_(False)


def _init_tensor(name: str, tensor: Tensor, std: float, generator: torch.Generator) -> None:
    """HF's rule for one parameter, in place: unit norms, zero biases, normal(0, std) otherwise."""
    if name.endswith("norm.weight"):
        tensor.fill_(1.0)
    elif name.endswith(".bias"):
        tensor.zero_()
    else:
        tensor.normal_(0.0, std, generator=generator)


def init_random(model: Decoder, seed: int = 0) -> Decoder:
    """HF's initialisation: normal(0, initializer_range) matrices and embeddings, zero biases, unit norms."""
    std = model.config.initializer_range
    gen_device = model.embed.weight.device
    generator = torch.Generator(device=gen_device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # a tied weight is listed once
            _init_tensor(name, param, std, generator)
    return model


def random_parameters(config: DecoderConfig, shapes: list[tuple[str, tuple[int, ...]]], device: torch.device,
                      seed: int) -> Iterator[tuple[str, Tensor]]:
    """`init_random`'s values one parameter at a time, as full fp32 tensors on `device`: the same
    numbers (the same generator, seed, order and draws) without the whole model in memory, for a
    model built on the meta device and sharded before its weights exist (kiln.distributed.materialise).
    `shapes`: the model's `named_parameters()` names and shapes, in order."""
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, shape in shapes:
            tensor = torch.empty(shape, device=device, dtype=torch.float32)
            _init_tensor(name, tensor, config.initializer_range, generator)
            yield name, tensor


def random_decoder(config: DecoderConfig, *, device: torch.device | str, dtype: torch.dtype, seed: int = 0) -> Decoder:
    return init_random(empty_decoder(config, device=device, dtype=dtype), seed)


def hf_parameters(config: DecoderConfig, shapes: dict[str, tuple[int, ...]], get: Callable[[str], Tensor],
                  available: Iterable[str], *, device: torch.device | str, where: str,
                  key: str = "--model") -> Iterator[tuple[str, Tensor]]:
    """A checkpoint's HF-named tensors as kiln's parameters (`shapes`: name -> shape), one fused tensor
    (in the checkpoint's dtype) on `device` at a time; the checkpoint's names are checked before the first."""
    names = hf_names(config)
    available = set(available)
    wanted = {n for parts in names.values() for n in parts}
    missing = sorted(wanted - available)
    if missing:
        raise ConfigError(key, f"{where}: checkpoint lacks {len(missing)} tensors kiln needs, e.g. {missing[:3]}")
    unexpected = sorted(n for n in available - wanted
                        if not n.endswith(_IGNORED_SUFFIXES) and not (n == "lm_head.weight" and config.tie_embeddings))
    if unexpected:
        raise ConfigError(key, f"{where}: checkpoint has tensors kiln's {config.family} decoder does not use, "
                          f"e.g. {unexpected[:3]} (a different architecture?)")
    for kiln_name, parts in names.items():
        shape = tuple(shapes[kiln_name])
        tensors = [get(p) for p in parts]
        for part, tensor in zip(parts, tensors):
            if not tensor.is_floating_point():
                raise ConfigError(key, f"{where}: {part} is {tensor.dtype}, not a floating-point weight (a "
                                  "quantized checkpoint? kiln quantizes at load: --quant)")
        if len({t.shape[1:] for t in tensors}) > 1:
            pieces = ", ".join(f"{p} {tuple(t.shape)}" for p, t in zip(parts, tensors))
            raise ConfigError(key, f"{where}: {pieces} cannot be fused: the config implies {shape} for {kiln_name}")
        value = torch.cat([t.to(device=device) for t in tensors], dim=0)  # its dtype: the caller casts
        if tuple(value.shape) != shape:
            raise ConfigError(key, f"{where}: {' + '.join(parts)} has shape {tuple(value.shape)}, "
                              f"the config implies {shape} for {kiln_name}")
        yield kiln_name, value


def load_hf_tensors(model: Decoder, get: Callable[[str], Tensor], available: Iterable[str], *, where: str,
                    key: str = "--model") -> Decoder:
    """Fill `model` from HF-named tensors: `get(name)` returns one, `available` lists them all."""
    params = dict(model.named_parameters(remove_duplicate=False))
    shapes = {name: tuple(p.shape) for name, p in params.items()}
    device = model.embed.weight.device
    with torch.no_grad():
        for name, value in hf_parameters(model.config, shapes, get, available, device=device, where=where, key=key):
            params[name].copy_(value)
    return model


def load_hf_state_dict(model: Decoder, state_dict: dict[str, Tensor], where: str = "state dict") -> Decoder:
    """Copy a transformers model's `state_dict()` into kiln's modules (same weights, fused layout)."""
    return load_hf_tensors(model, state_dict.__getitem__, state_dict.keys(), where=where)


def safetensors_files(directory: Path, key: str = "--model") -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(key, f"cannot read {index}: {exc}") from None
        files = [directory / f for f in dict.fromkeys(weight_map.values())]
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        bins = sorted(p.name for p in directory.glob("pytorch_model*.bin"))
        extra = f" (it has {bins[0]}: kiln loads safetensors only, which never unpickle code)" if bins else ""
        raise ConfigError(key, f"no *.safetensors weights in {directory}{extra}")
    absent = [str(f) for f in files if not f.is_file()]
    if absent:
        raise ConfigError(key, f"weight file listed in the index is missing: {absent[0]}")
    return files


def open_safetensors_dir(directory: Path, key: str = "--model") -> tuple[Callable[[str], Tensor], list[str]]:
    """`(get, names)`: read one tensor (on the CPU) of the model directory's safetensors by name, and all the names."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:
        raise ConfigError(key, f"loading {directory} needs safetensors; {INSTALL_HINT}") from None
    files = safetensors_files(directory, key)
    try:
        handles = [safe_open(str(f), framework="pt", device="cpu") for f in files]
    except (SafetensorError, OSError) as exc:
        raise ConfigError(key, f"cannot open the safetensors in {directory}: {exc}") from None
    where_is = {name: h for h in handles for name in h.keys()}
    return (lambda name: where_is[name].get_tensor(name)), list(where_is)


def load_safetensors_dir(model: Decoder, directory: Path, key: str = "--model") -> Decoder:
    get, names = open_safetensors_dir(directory, key)
    return load_hf_tensors(model, get, names, where=str(directory), key=key)


def tensor_nbytes(t: Tensor) -> int:
    """Bytes a tensor holds: a quantized tensor subclass (torchao) counts its inner tensors
    (packed data, scales, zero points), a bitsandbytes 4-bit weight its data plus its quant state."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_nbytes(getattr(t, n)) for n in names if getattr(t, n) is not None)
    total = t.numel() * t.element_size()
    state = getattr(t, "quant_state", None)
    while state is not None:  # bitsandbytes QuantState, possibly nested (double quantization)
        total += sum(v.numel() * v.element_size() for v in vars(state).values() if isinstance(v, Tensor))
        state = getattr(state, "state2", None)
    return total


def _weight_tensors(model: nn.Module) -> dict[int, tuple[str, Tensor]]:
    """Every distinct weight tensor (parameters, and buffers of quantized layers), by identity; the
    rotary frequencies are not weights."""
    found: dict[int, tuple[str, Tensor]] = {}
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        if not name.endswith("inv_freq"):
            found.setdefault(id(t), (name, t))
    return found


def count_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights (a tied weight counted once; quantized tensors at their real size)."""
    return sum(tensor_nbytes(t) for _, t in _weight_tensors(model).values())


def decode_weight_bytes(model: Decoder) -> int:
    """Weight bytes one decode step reads: every matrix and norm once, and of an input embedding
    that is not also the output head only the rows it looks up (ignored) -- the batch-1 decode
    bandwidth ceiling. With a quantized head the embedding is such a separate table."""
    total = count_bytes(model)
    if model.lm_head is not None and getattr(model.lm_head, "weight", None) is not model.embed.weight:
        total -= tensor_nbytes(model.embed.weight)
    return total


def build_decoder(source: ModelSource, *, device: torch.device | str, dtype: torch.dtype, seed: int = 0,
                  key: str = "--model") -> Decoder:
    """The model `source` names: its safetensors when its directory has them, else random weights."""
    config = config_from_dict(source.raw, key)
    if source.directory is not None and (has_weights(source.directory)
                                         or any(source.directory.glob("pytorch_model*.bin"))):
        return load_safetensors_dir(empty_decoder(config, device=device, dtype=dtype), source.directory, key)
    return random_decoder(config, device=device, dtype=dtype, seed=seed)
