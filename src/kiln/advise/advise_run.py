"""`kiln advise`: every check on one model and config, each isolated (a check that fails becomes an
`error` finding, the others go on), static checks first, then the measured ones."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from kiln.advise import channels_last as layout
from kiln.advise import runs, shapes, static
from kiln.advise.findings import Finding, failed
from kiln.config.schema import Config
from kiln.cpu.threads import cpu_settings
from kiln.diagnose.explain import explain_target
from kiln.diagnose.inputs import inputs_from_spec, to_device
from kiln.diagnose.target import Target, retarget
from kiln.errors import ConfigError
from kiln.models import build_model
from kiln.noise import filtered_fds
from kiln.precision import apply_precision, autocast, resolve_precision, tf32_enabled
from kiln.runtime import resolve_device, seed_everything
from kiln.tune.space import config_recipe

log = logging.getLogger("kiln.advise")


def _compute_dtype(policy) -> torch.dtype:
    return policy.autocast_dtype or policy.param_dtype


INTERRUPTED = "interrupted (Ctrl-C)"
OVER_BUDGET = "over the --budget"
CPU_SLOW_PARAMS = 20_000_000
"""Parameters from which measuring on a CPU says up front that it takes minutes (without --budget)."""


def _stopped(stop: dict[str, Any]) -> str | None:
    """Why no further check starts: a Ctrl-C, or the budget's deadline passed; None to go on."""
    if stop["interrupted"]:
        return INTERRUPTED
    if stop["deadline"] is not None and time.monotonic() > stop["deadline"]:
        stop["over_budget"] = True
        return OVER_BUDGET
    return None


def _guard(findings: list[Finding], check: str, title: str, fn: Callable[[], Finding], say: Callable[[str], None],
           stop: dict[str, Any]):
    """Run one check into `findings`; after a Ctrl-C or past the budget the rest are listed as not
    run (a check already running finishes), the findings made so far are kept."""
    why = _stopped(stop)
    if why is not None:
        findings.append(Finding(check, title, "n/a", f"not run: {why}"))
        return
    say(f"checking {title}")
    try:
        findings.append(fn())
    except ConfigError:
        raise
    except KeyboardInterrupt:
        stop["interrupted"] = True
        findings.append(Finding(check, title, "n/a", f"{INTERRUPTED} during this check"))
    except Exception as exc:  # one broken check must not hide the others
        log.debug("advise check %s failed", check, exc_info=True)
        findings.append(failed(check, title, exc))


def advise(cfg: Config, *, measure: bool = True, say: Callable[[str], None] | None = None,
           budget_min: float | None = None) -> dict[str, Any]:
    """The advise report (JSON-friendly): the findings, in order, and what they were run on.
    `budget_min`: no check starts after this many minutes (from the call); those left are listed as
    not run."""
    if budget_min is not None and not budget_min > 0:
        raise ConfigError("--budget", f"minutes must be > 0, got {budget_min}")
    started = time.monotonic()
    say = say or (lambda message: None)
    device = resolve_device(cfg.training.device)
    policy = resolve_precision(cfg.precision.policy, device)
    seed_everything(cfg.training.seed)
    built = build_model(cfg.model)
    spec = built.input_spec
    if spec is None:
        raise ConfigError("TARGET", f"{cfg.model.name!r} declares no input shape; return (module, example_input) or "
                          "(module, {'kind': ..., 'shape': ...}) from the factory")
    if spec.kind == "tokens" and cfg.data.seq_len:
        spec = dataclasses.replace(spec, shape=(cfg.data.seq_len,))
    inputs = to_device(inputs_from_spec(spec, batch=cfg.data.batch_size), device)
    module = apply_precision(built.module.to(device), policy)
    if policy.param_dtype != torch.float32:
        inputs = tuple(x.to(policy.param_dtype) if x.is_floating_point() else x for x in inputs)
    num_params = sum(p.numel() for p in module.parameters())
    if measure and budget_min is None and device.type == "cpu" and num_params >= CPU_SLOW_PARAMS:
        say(f"{num_params / 1e6:.0f}M parameters on a CPU: each measured check runs the model, minutes each; "
            "--budget MIN starts no check after MIN minutes, --no-measure runs the static checks only")
    findings: list[Finding] = []
    stop: dict[str, Any] = {"interrupted": False, "over_budget": False,
                            "deadline": started + 60 * budget_min if budget_min is not None else None}
    cpu = cpu_settings(cfg.cpu) if device.type == "cpu" else contextlib.nullcontext()
    with tf32_enabled(cfg.precision.tf32), cpu:
        def forward() -> Any:
            with autocast(policy, device):
                return module(*inputs)

        gemms: list = []
        _guard(findings, "graph_breaks", "graph breaks (torch.compile)", lambda: static.check_graph_breaks(
            explain_target(Target(cfg.model.name, module, [inputs], "config"), vary=[], device=str(device)), cfg), say, stop)
        param_bytes = torch.finfo(policy.param_dtype).bits // 8
        _guard(findings, "strategy", "DDP vs FSDP fit",
               lambda: static.check_strategy(cfg, num_params, param_bytes, device), say, stop)
        if device.type == "cpu":
            _guard(findings, "cpu_threads", "CPU threads and pinning", lambda: static.check_cpu_threads(cfg), say, stop)
        run: dict[str, Any] | None = None
        if measure and _stopped(stop) is None:
            say("a short profiled training run of the config (in a temporary directory, removed after)")
            try:
                with filtered_fds():  # the profiler's native `USDT:` lines go to dependencies.log
                    run = runs.short_profile(cfg)
            except ConfigError:
                raise
            except KeyboardInterrupt:  # the whole of advise stops, not only its inner run
                stop["interrupted"] = True
            except Exception as exc:
                findings.append(failed("data_loader", "data loader keeps up", exc))
        if run is not None:
            _guard(findings, "data_loader", "data loader keeps up", lambda: runs.check_data_loader(cfg, run), say, stop)
        elif not any(f.check == "data_loader" for f in findings):
            why = f"not run: {_stopped(stop)}" if _stopped(stop) else "needs a short training run (--measure)"
            findings.append(Finding("data_loader", "data loader keeps up", "n/a", why))
        recipe, blocks = config_recipe(cfg), bool(built.blocks)
        measuring = measure and _stopped(stop) is None
        with runs.measuring_session(cfg, recipe, blocks) if measuring else contextlib.nullcontext() as session:
            step_s = None
            if session is not None:  # the eager step at the config's precision: the scale of the GEMM gains
                say("the eager step at the config's precision (every measured gain's scale)")
                try:
                    row = session.eager(cfg.precision.policy)[0]
                    step_s = row["step_ms"] / 1e3 if row.get("step_ms") else None
                except KeyboardInterrupt:
                    stop["interrupted"] = True

            def alignment() -> Finding:
                gemms.extend(shapes.collect_gemms(module, inputs, forward))
                return shapes.check_alignment(gemms, dtype=_compute_dtype(policy), device=device, measure=measure,
                                              step_s=step_s)

            _guard(findings, "alignment", "tensor-core shapes (dims multiple of 8)", alignment, say, stop)
            _guard(findings, "channels_last", "channels-last for convolutions", lambda: layout.check_channels_last(
                module, inputs, device=device, measure=measure, context=lambda: autocast(policy, device)), say, stop)
            _guard(findings, "precision", "bf16 where fp32 is used",
                   lambda: runs.check_precision(cfg, device, session=session), say, stop)
            _guard(findings, "launch_bound", "launch-bound steps (CUDA graphs)", lambda: runs.check_launch_bound(
                cfg, run, recipe, device, has_blocks=blocks, session=session), say, stop)
    order = ["alignment", "precision", "channels_last", "data_loader", "graph_breaks", "launch_bound", "strategy",
             "cpu_threads"]
    findings.sort(key=lambda f: order.index(f.check) if f.check in order else len(order))
    counts = {s: sum(f.status == s for f in findings) for s in dict.fromkeys(f.status for f in findings)}
    return {
        "target": cfg.model.name,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": cfg.precision.policy,
        "batch_size": cfg.data.batch_size,
        "measured": measure,
        "torch": torch.__version__,
        "step_ms": (run or {}).get("run_step_ms"),
        "counts": counts,
        "interrupted": stop["interrupted"],
        "over_budget": stop["over_budget"],
        "budget_min": budget_min,
        "findings": [f.as_dict() for f in findings],
    }


def advise_target(cfg: Config, *, measure: bool, say: Callable[[str], None], budget_min: float | None) -> dict[str, Any]:
    """`advise`, with a bad model.name reported as TARGET (as kiln advise's user typed it)."""
    try:
        return advise(cfg, measure=measure, say=say, budget_min=budget_min)
    except ConfigError as exc:
        raise retarget(exc) from None

