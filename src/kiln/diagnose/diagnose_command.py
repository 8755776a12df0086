"""`kiln explain` and `kiln doctor` from their requests: every flag checked (ConfigError naming it,
before the model is built), the target loaded, the report made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.diagnose.backends import build_ladder, resolve_backend
from kiln.diagnose.diagnose_request import DoctorRequest, ExplainRequest
from kiln.diagnose.doctor import run_doctor
from kiln.diagnose.explain import explain_target
from kiln.diagnose.target import check_device, load_target, parse_kwargs
from kiln.diagnose.vary import parse_vary
from kiln.runtime import default_run_dir


def explain_command(request: ExplainRequest) -> dict[str, Any]:
    """The explain report (kiln.diagnose.explain.explain_target) of the request's target."""
    device = check_device(request.device)
    vary = [] if request.no_vary else (parse_vary(request.vary) if request.vary else None)
    if request.backend:
        resolve_backend(request.backend)  # an unknown name is refused before the model is built
    target = load_target(request.target, parse_kwargs(request.kwarg), request.inputs, request.inputs_from)
    return explain_target(target, backend=request.backend, train=request.train, vary=vary, device=device,
                          verify=not request.no_verify)


def doctor_out_dir(request: DoctorRequest) -> Path:
    """--out, or a new run dir named after the target: never the current directory, which may be a
    source tree (the repro's files would land among the user's own)."""
    return Path(request.out) if request.out else default_run_dir(f"doctor-{request.target.rsplit(':', 1)[-1]}")


def doctor_command(request: DoctorRequest) -> dict[str, Any]:
    """The doctor report (kiln.diagnose.doctor.run_doctor) of the request's target."""
    device = check_device(request.device)
    stages = [s.strip() for s in request.stages.split(",") if s.strip()] if request.stages else None
    build_ladder(stages, request.mode, request.backend)  # bad names are refused before the model is built
    target = load_target(request.target, parse_kwargs(request.kwarg), request.inputs, request.inputs_from)
    return run_doctor(target, stages=stages, mode=request.mode, backends=request.backend, train=bool(request.train),
                      tol=request.tol, device=device, bisect=not request.no_bisect, out_dir=doctor_out_dir(request),
                      repro=not request.no_repro)
