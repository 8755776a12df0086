"""Narrow an Inductor failure down to a subsystem with torch's CompilerBisector, where torch has one.

`torch._inductor.compiler_bisector.CompilerBisector.do_bisect(fn)` (PyTorch 2.6+, grown since)
reruns `fn` while it overrides the backend of every torch.compile call (eager, aot_eager, ...,
inductor) and then disables inductor subsystems (pre/post-grad passes, lowerings, ...) one by one,
binary-searching the n-th application that breaks. `fn` returns True when the result is good.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any


def bisector_available() -> bool:
    try:
        from torch._inductor.compiler_bisector import CompilerBisector
    except ImportError:
        return False
    return hasattr(CompilerBisector, "do_bisect")


def bisect_inductor(check: Callable[[], bool]) -> dict[str, Any]:
    """Run the bisector with `check` as the predicate; the result, or why there is none."""
    if not bisector_available():
        return {"status": "unavailable", "note": "this torch has no torch._inductor.compiler_bisector.CompilerBisector"}
    from torch._inductor.compiler_bisector import CompilerBisector

    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):  # the bisector narrates each step on stdout
            result = CompilerBisector.do_bisect(check)
    except Exception as exc:
        return {"status": "error", "note": f"bisector failed: {type(exc).__name__}: {exc}", "log": log.getvalue()}
    if result is None:
        return {"status": "not_reproduced", "note": "every backend passed while bisecting (flaky failure?)",
                "log": log.getvalue()}
    out = {
        "status": "found",
        "backend": result.backend,
        "subsystem": getattr(result, "subsystem", None),
        "bisect_number": getattr(result, "bisect_number", None),
        "debug_info": getattr(result, "debug_info", None),
        "log": log.getvalue(),
    }
    out["summary"] = _summary(out)
    change = config_change(out["subsystem"])
    if change is not None:
        out["config_change"] = change
        out["tried"] = verify_config(check, change)
        out["summary"] += f"; {out['tried']['result']}"
    return out


_CONFIG_MODULES = {"inductor": "torch._inductor.config", "aot_eager_decomp_partition": "torch._functorch.config"}


def config_change(subsystem: str | None) -> dict[str, Any] | None:
    """The config setting torch's bisector changed when it blamed `subsystem` (one of its ConfigChange
    entries: a field set *to* a value, which is the fix), or None for a pass or lowering subsystem."""
    try:
        from torch._inductor.compiler_bisector import BACKENDS, ConfigChange
    except ImportError:
        return None
    for subsystems in BACKENDS.values():
        for sub in subsystems:
            if isinstance(sub, ConfigChange) and sub.name == subsystem:
                module = _CONFIG_MODULES.get(sub.config_name, sub.config_name)
                return {"module": module, "field": sub.config_field, "value": sub.config_value,
                        "setting": f"{module}.{sub.config_field} = {sub.config_value}"}
    return None


def verify_config(check: Callable[[], bool], change: dict[str, Any]) -> dict[str, Any]:
    """Re-run `check` with the config change applied: verified when the result is then good."""
    import importlib

    config = importlib.import_module(change["module"])
    try:
        with config.patch({change["field"]: change["value"]}):
            good = check()
    except Exception as exc:  # a config torch no longer has
        return {"fix": change["setting"], "verified": False, "result": f"not verified: {type(exc).__name__}: {exc}"}
    result = ("verified: kiln re-ran the stage with it and the result matches eager" if good else
              "not verified: kiln re-ran the stage with it and it still fails")
    return {"fix": change["setting"], "verified": good, "result": result}


def _summary(r: dict[str, Any]) -> str:
    change = config_change(r["subsystem"])
    if change is not None:
        # torch's ConfigChange: the bisector *set* the field to this value and that fixed it.
        return f"{r['backend']}: setting `{change['setting']}` fixes it (torch's bisector changed that one setting)"
    if not r["subsystem"]:
        if r["backend"] != "inductor":
            # The bisector's backend list includes stages the ladder does not run (e.g. the crossref one).
            return (f"torch's bisector already saw the failure with its {r['backend']} backend, so it blamed no "
                    "inductor subsystem")
        return f"the failure starts at backend {r['backend']}; no single subsystem could be blamed"
    text = f"{r['backend']} / {r['subsystem']}"
    if r["subsystem"] == "lowerings" and r["debug_info"]:
        text += f": lowering #{r['bisect_number']} ({r['debug_info']}) - the op is lowered wrongly"
    elif r["bisect_number"]:
        text += f": application #{r['bisect_number']}" + (f" ({r['debug_info']})" if r["debug_info"] else "")
    else:
        text += " - turning it off fixes the result"
    return text
