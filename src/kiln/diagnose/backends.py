"""The stages of `kiln doctor`: which torch.compile backend each runs, and what a failure there means.

The ladder is the one the torch.compile troubleshooting guide (and the seed article) walks by hand:
each stage adds one layer, so the first stage that fails names the layer at fault.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kiln.config.validate import compile_backends, compile_modes
from kiln.errors import ConfigError
from kiln.models.user import load_factory

DEFAULT_LADDER = ("eager", "aot_eager", "aot_eager_decomp_partition", "inductor")
CROSSREF = "aot_eager_decomp_partition_crossref"
"""Not in the ladder: run to confirm a custom op's fake implementation is at fault."""
LAYERS = {
    "eager": "TorchDynamo graph capture (bytecode tracing, guards)",
    "aot_eager": "AOTAutograd (functionalization, joint forward/backward tracing)",
    "aot_eager_decomp_partition": "decompositions and the forward/backward partitioner",
    "inductor": "TorchInductor (lowering, fusion, generated kernels)",
    CROSSREF: "fake-vs-real cross-check: every op also runs on fake tensors, and a mismatch in shape, dtype or "
              "strides means the op's fake (meta) implementation disagrees with its kernel",
}
BACKEND_FORMS = ("a name from torch._dynamo.list_backends(exclude_tags=())", "package.module:function",
                 "path/to/file.py:function")


@dataclass
class Stage:
    label: str
    """What reports call the stage: the backend name, `inductor:<mode>`, or the import path."""
    backend: str | Callable
    mode: str | None = None

    @property
    def is_inductor(self) -> bool:
        return self.backend == "inductor"

    @property
    def layer(self) -> str:
        base = self.label.split(":")[0] if isinstance(self.backend, str) else ""
        return LAYERS.get(base, "a user-supplied backend")


def _load_backend(spec: str) -> Callable:
    try:
        return load_factory(spec)
    except ConfigError as exc:
        message = str(exc).removeprefix(f"{exc.key}: ")
        raise ConfigError("--backend", message, exc.choices) from None


def resolve_backend(name: str) -> str | Callable:
    """A registered backend name (debug backends included) or a `module:function` backend callable."""
    name = name.strip()
    if name in compile_backends():
        return name
    if ":" in name:
        return _load_backend(name)
    removed = {"nvfuser": "inductor", "aot_ts_nvfuser": "inductor", "aot_nvfuser": "inductor"}
    hint = f"; {name!r} was removed from PyTorch, use {removed[name]!r}" if name in removed else ""
    raise ConfigError("--backend", f"unknown backend {name!r}{hint}", [*compile_backends(), *BACKEND_FORMS[1:]])


def check_mode(mode: str | None) -> str | None:
    if not mode or mode == "default":
        return None
    modes = compile_modes()
    if mode not in modes:
        hint = "; use 'max-autotune'" if mode.replace("_", "-") == "max-performance" else ""
        raise ConfigError("--mode", f"unknown torch.compile mode {mode!r}{hint}", modes)
    return mode


def build_ladder(stages: list[str] | None, mode: str | None, extra_backends: list[str] | None) -> list[Stage]:
    """Default ladder (+ inductor with `mode`), or `--stages`; then each `--backend` as a further stage."""
    mode = check_mode(mode)
    names = list(stages) if stages else list(DEFAULT_LADDER)
    ladder = [Stage(n, resolve_backend(n)) for n in names]
    if mode:
        if not any(s.is_inductor for s in ladder):
            raise ConfigError("--mode", "a mode needs the inductor stage; add inductor to --stages")
        ladder.append(Stage(f"inductor:{mode}", "inductor", mode))
    for name in extra_backends or []:
        ladder.append(Stage(name, resolve_backend(name)))
    if not ladder:
        raise ConfigError("--stages", "no stage to run", DEFAULT_LADDER)
    return ladder
