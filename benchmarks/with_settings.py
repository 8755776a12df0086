"""Run a kiln command with module-level settings changed first: an end-to-end A/B of a kernel's swept
settings (a server under load, `kiln bench llm`) without editing the tree.

    python benchmarks/with_settings.py kiln.kernels.triton_decode.BALANCE=True \\
        kiln.kernels.triton_decode.TARGET_PROGRAMS=512 -- serve --model llama-3.2-3b ...

Each SETTING is MODULE.NAME=VALUE, VALUE a Python literal (1, 512, True, None, 'x'); the module must
already define NAME, so a typo exits 2 before kiln starts. The settings hold in this process only:
a command that starts other processes (`kiln train --nproc-per-node`) does not pass them on. The
environment a results file records (kiln.monitor.env.collect_env) lists them as `module_settings`.
benchmarks/serve.sh runs its server and bench rows through this with KILN_SETTINGS="SETTING ...".
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from typing import Any


def parse_setting(text: str) -> tuple[str, str, Any]:
    """(module, name, value) of MODULE.NAME=VALUE; ValueError saying what is wrong."""
    target, sep, raw = text.partition("=")
    module, dot, name = target.rpartition(".")
    if not sep or not dot or not module or not name:
        raise ValueError(f"{text!r} is not MODULE.NAME=VALUE")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        raise ValueError(f"{text!r}: {raw!r} is not a Python literal (1, 512, True, None, 'x')") from None
    return module, name, value


def resolve_setting(text: str) -> tuple[Any, str, Any]:
    """(module, name, value) of MODULE.NAME=VALUE, the module imported and holding NAME; ValueError
    saying what is wrong."""
    module_name, name, value = parse_setting(text)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{text!r}: module {module_name!r} cannot be imported ({exc})") from None
    if not hasattr(module, name):
        raise ValueError(f"{text!r}: {module_name} has no {name!r}")
    return module, name, value


def apply_settings(settings: list[str]) -> list[str]:
    """Set each MODULE.NAME=VALUE (and list it in kiln.monitor.env.APPLIED_SETTINGS); returns what
    was set as `MODULE.NAME: old -> new` lines."""
    from kiln.monitor.env import APPLIED_SETTINGS

    done = []
    for text in settings:
        module, name, value = resolve_setting(text)
        module_name = module.__name__
        done.append(f"{module_name}.{name}: {getattr(module, name)!r} -> {value!r}")
        setattr(module, name, value)
        APPLIED_SETTINGS.append(f"{module_name}.{name}={value!r}")
    return done


def main(argv: list[str] | None = None, run: Callable[[list[str]], int] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("with_settings.py: usage: with_settings.py MODULE.NAME=VALUE ... -- KILN_ARGS...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    try:
        done = apply_settings(argv[:cut])
    except ValueError as exc:
        print(f"with_settings.py: {exc}", file=sys.stderr)
        return 2
    for line in done:
        print(f"with_settings.py: {line}", file=sys.stderr)
    if run is None:
        from kiln.cli.main import main as run
    return run(argv[cut + 1:])


if __name__ == "__main__":
    sys.exit(main())
