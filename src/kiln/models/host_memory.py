"""How much host memory a model needs, how much this machine has, and refusing a build that
cannot fit (an 8B fp32 model on a 23 GiB machine is otherwise killed by the kernel's OOM killer,
which leaves no message).

`check_fits` counts what is certain for a number of parameters: the parameters as built (fp32,
the dtype kiln builds in), and for a CPU run the gradients and optimizer state as well (AdamW:
two fp32 moments per parameter; SGD with momentum: one). A model built on the host and then moved
to a GPU still passes through host memory once, as its fp32 parameters. A training run's whole
estimate, activations included, is kiln.train.memory_plan's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from kiln.errors import ConfigError
from kiln.llm.families import family_spec

GIB = 1 << 30


def host_memory() -> tuple[int | None, int | None]:
    """(total, available) bytes of this host from /proc/meminfo (Linux), else (None, None); a
    cgroup memory limit (containers) lowers both."""
    total = available = None
    try:
        text = Path("/proc/meminfo").read_text()
        total = int(re.search(r"MemTotal:\s+(\d+) kB", text).group(1)) * 1024
        available = int(re.search(r"MemAvailable:\s+(\d+) kB", text).group(1)) * 1024
    except (OSError, AttributeError, ValueError):
        return None, None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < total:
            total, available = int(raw), min(available, int(raw))
        break
    return total, available


def optimizer_slots(optimizer: str, momentum: float = 0.0) -> int:
    """fp32 values per parameter the optimizer keeps (AdamW/Adam: exp_avg and exp_avg_sq)."""
    name = optimizer.lower()
    if "adam" in name or "lamb" in name:
        return 2
    if name == "sgd":
        return 1 if momentum else 0
    return 2  # unknown: assume Adam-like


def training_state_bytes(num_params: int, *, device_type: str, optimizer: str = "adamw",
                         momentum: float = 0.0, param_bytes: int = 4) -> int:
    """Host bytes certainly held for `num_params` parameters: weights (built fp32); on a CPU run
    also gradients and optimizer state."""
    if device_type != "cpu":
        return num_params * param_bytes
    return num_params * (param_bytes * 2 + 4 * optimizer_slots(optimizer, momentum))


def _checked_host() -> tuple[int | None, int | None]:
    """host_memory(), or (None, None) where KILN_SKIP_MEMORY_CHECK=1 asks to try anyway."""
    return (None, None) if os.environ.get("KILN_SKIP_MEMORY_CHECK") == "1" else host_memory()


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def check_fits(num_params: int, *, device_type: str, optimizer: str = "adamw", momentum: float = 0.0,
               what: str = "model.name") -> None:
    """ConfigError (exit 2) when the model's certain host memory exceeds what this host has
    available, naming both; nothing is built. `KILN_SKIP_MEMORY_CHECK=1` skips the check."""
    total, available = _checked_host()
    if available is None:
        return
    need = training_state_bytes(num_params, device_type=device_type, optimizer=optimizer, momentum=momentum)
    if need > available:
        parts = "fp32 weights" if device_type != "cpu" else "fp32 weights, gradients and optimizer state"
        raise ConfigError(what, f"{num_params / 1e9:.2f}B parameters need at least {gib(need)} of host memory "
                          f"({parts}); this host has {gib(available)} available of {gib(total)}: use a smaller "
                          "model or a machine with more memory (KILN_SKIP_MEMORY_CHECK=1 tries anyway)")


def decoder_params(config) -> int:
    """Parameters of kiln's decoder for a DecoderConfig (its family's module), counted on the meta
    device (nothing allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in family_spec(config.family).build(config).parameters())


def generation_host_bytes(config, *, dtype_bytes: int, rows: int, tokens: int) -> dict[str, int]:
    """What `kiln generate` holds in host memory on a CPU, by part (bytes): the weights in the
    dtype built, the KV cache of `rows` x `tokens` slots, and one row set of fp32 logits."""
    cache = rows * tokens * config.n_layers * 2 * config.n_kv_heads * config.head_dim * dtype_bytes
    return {"weights": decoder_params(config) * dtype_bytes, "KV cache": cache,
            "logits": rows * config.vocab_size * 4}


def check_generation_fits(config, *, dtype: str, dtype_bytes: int, rows: int, tokens: int) -> None:
    """ConfigError naming --dtype (exit 2) when a CPU generation cannot fit in this host's available
    memory, with bf16 as the fix where it would fit; `KILN_SKIP_MEMORY_CHECK=1` skips the check."""
    total, available = _checked_host()
    if available is None:
        return
    parts = generation_host_bytes(config, dtype_bytes=dtype_bytes, rows=rows, tokens=tokens)
    need = sum(parts.values())
    if need <= available:
        return
    fix = ("--dtype bf16 (half the bytes)" if dtype_bytes == 4 and need / 2 <= available
           else "a smaller model, fewer prompts or tokens, or a GPU")
    shown = ", ".join(f"{k} {gib(v)}" for k, v in parts.items())
    raise ConfigError("--dtype", f"generating in {dtype} needs about {gib(need)} of host memory on this CPU ({shown}); "
                      f"this host has {gib(available)} available of {gib(total)}: {fix} "
                      "(KILN_SKIP_MEMORY_CHECK=1 tries anyway)")
