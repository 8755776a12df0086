"""The software and hardware a run or benchmark ran on, for `kiln env` and for results.json.

Everything here is best effort: a missing GPU, driver tool or optional package yields None (or an
empty list), never an exception, since `kiln env` is what people run when something is broken.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from kiln import __version__
from kiln.cpu.describe import cpu_env, cpu_recommendations
from kiln.monitor.nvml import import_nvml

__all__ = ["collect_env", "render_env"]

# Distribution names (as pip knows them) reported by version without importing them.
_OPTIONAL_PACKAGES = ("transformers", "timm", "tensorboard", "nvidia-ml-py", "torchao", "numpy", "rich")


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _kiln_version() -> str:
    return __version__


def _cpu_model() -> str | None:
    # platform.processor() is just "x86_64" on most Linux systems, so /proc/cpuinfo comes first.
    cpuinfo = Path("/proc/cpuinfo")
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or None


def _driver_version() -> str | None:
    """NVIDIA driver version via NVML (kiln[gpu]) if present, else nvidia-smi, else None."""
    pynvml = import_nvml()
    if pynvml is not None:
        with contextlib.suppress(Exception):  # no driver / no NVIDIA GPU: fall through to nvidia-smi
            pynvml.nvmlInit()
            try:
                version = pynvml.nvmlSystemGetDriverVersion()
            finally:
                pynvml.nvmlShutdown()
            # Older nvidia-ml-py releases return bytes.
            return version.decode() if isinstance(version, bytes) else str(version)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=15,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return lines[0] if lines else None


def _gpus() -> list[dict[str, Any]]:
    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "index": index,
                "name": props.name,
                "total_memory_bytes": int(props.total_memory),
                "compute_capability": f"{props.major}.{props.minor}",
                "multiprocessors": int(props.multi_processor_count),
            }
        )
    return gpus


def _cxx_compiler() -> str | None:
    # Inductor's CPU backend builds C++ (torch._inductor.cpp_builder honours $CXX first).
    candidates = [os.environ.get("CXX"), "g++", "clang++", "c++", "gcc", "clang", "cc"]
    for name in candidates:
        if name and (path := shutil.which(name)):
            return path
    return None


def _compile_backends() -> list[str]:
    try:
        import torch._dynamo

        return list(torch._dynamo.list_backends())
    except Exception:
        return []


def _compile_modes() -> list[str]:
    try:
        import torch._inductor

        return list(torch._inductor.list_mode_options())
    except Exception:
        return []


def _recommendations(env: dict[str, Any]) -> list[str]:
    recs: list[str] = []
    gpus = env["gpus"]
    if gpus:
        capabilities = [tuple(int(x) for x in g["compute_capability"].split(".")) for g in gpus]
        if min(capabilities) >= (8, 0):
            recs.append("precision.policy=bf16-mixed on Ampere+ GPUs (compute capability >= 8.0)")
            recs.append("precision.tf32=true: TF32 tensor cores for the matmuls that stay in fp32")
        else:
            recs.append("precision.policy=fp16-mixed on pre-Ampere GPUs (no bf16 tensor cores)")
        recs.append("optim.fused=auto: fused AdamW on CUDA (one kernel for all parameters)")
        if env["triton"] is None:
            recs.append("triton is not installed: inductor cannot generate GPU kernels; pip install triton")
        if len(gpus) > 1:
            recs.append(f"{len(gpus)} GPUs: train on all with kiln train --nproc-per-node {len(gpus)}")
    else:
        recs.append("no CUDA device: training runs on CPU; keep models and batches small")
    if env["cxx_compiler"] is None:
        recs.append("no C++ compiler: inductor on CPU will fail; use compile.backend=aot_eager")
    if "nvidia-ml-py" not in env["packages"] or env["packages"]["nvidia-ml-py"] is None:
        if gpus:
            recs.append("pip install 'kiln[gpu]' (nvidia-ml-py) for driver and GPU utilisation readings")
    if env.get("cpu_info"):
        recs += cpu_recommendations(env["cpu_info"], bool(gpus), env["cxx_compiler"])
    return recs


def _cpu_info() -> dict[str, Any] | None:
    try:
        return cpu_env()
    except Exception:  # best effort, like everything here
        return None


APPLIED_SETTINGS: list[str] = []
"""Module settings changed in this process before its command ran (`MODULE.NAME=VALUE`, set by
benchmarks/with_settings.py), recorded as `module_settings` in every environment collect_env
describes, so a results file says which settings measured it."""


def collect_env() -> dict[str, Any]:
    """A JSON-serialisable description of this machine and its software."""
    triton_version = _dist_version("triton") or _dist_version("pytorch-triton")
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "kiln": _kiln_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "cudnn": cudnn,
        "cuda_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "gpus": _gpus(),
        "driver": _driver_version(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_info": _cpu_info(),
        "triton": triton_version,
        "compile_backends": _compile_backends(),
        "compile_modes": _compile_modes(),
        "cxx_compiler": _cxx_compiler(),
        "packages": {name: _dist_version(name) for name in _OPTIONAL_PACKAGES},
    }
    if APPLIED_SETTINGS:
        env["module_settings"] = list(APPLIED_SETTINGS)
    env["recommendations"] = _recommendations(env)
    return env


def render_env(env: dict[str, Any]) -> Any:
    """A rich renderable (a table, then the recommendations) for `kiln env`."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def show(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, (list, tuple)):
            return ", ".join(str(v) for v in value) or "-"
        return str(value)

    table = Table(title="kiln env", show_header=False, box=None, pad_edge=False)
    table.add_column("key", style="bold")
    table.add_column("value", overflow="fold")
    for key in ("kiln", "python", "platform", "torch", "cuda", "hip", "cudnn", "driver", "triton"):
        if key == "hip" and env.get(key) is None:
            continue
        table.add_row(key, show(env.get(key)))
    table.add_row("cpu", f"{show(env.get('cpu'))} ({show(env.get('cpu_count'))} logical cores)")
    cpu = env.get("cpu_info")
    if cpu:
        nodes = ", ".join(f"node {n}: CPUs {cpus}" for n, cpus in cpu["numa_nodes"].items())
        table.add_row("cpu topology", f"{cpu['sockets']} socket(s), {cpu['physical_cores']} physical cores, "
                      f"{cpu['logical_cpus']} logical CPUs, {len(cpu['numa_nodes'])} NUMA node(s) ({nodes})")
        table.add_row("cpu isa", f"{show(cpu['isa'])}; torch kernels {cpu['torch_capability']}; native bf16: "
                      f"{'yes' if cpu['native_bf16'] else 'no'}")
        table.add_row("cpu threads", f"affinity CPUs {cpu['affinity']} ({cpu['affinity_physical_cores']} physical "
                      f"cores); torch now {cpu['torch_threads']}, OMP_NUM_THREADS {show(cpu['omp_num_threads'])}; "
                      f"kiln uses {cpu['kiln_threads']} ({cpu['kiln_threads_source']})")
        launchers = cpu["launchers"]
        table.add_row("cpu launchers", ", ".join(
            f"{name} {'yes' if launchers[key] else 'no'}" for name, key in (
                ("torch.backends.xeon.run_cpu", "run_cpu"), ("numactl", "numactl"), ("taskset", "taskset"),
                ("torchrun --numa-binding", "torchrun_numa_binding"))))
        table.add_row("inductor cpu backend", show(cpu.get("inductor_cpu_backend")))
    gpus = env.get("gpus") or []
    if not gpus:
        table.add_row("gpus", "none (CUDA available: " + show(env.get("cuda_available")) + ")")
    for gpu in gpus:
        mem_gib = gpu["total_memory_bytes"] / 2**30
        table.add_row(
            f"gpu {gpu['index']}", f"{gpu['name']}, {mem_gib:.1f} GiB, sm_{gpu['compute_capability'].replace('.', '')}"
        )
    table.add_row("c++ compiler", show(env.get("cxx_compiler")))
    table.add_row("compile backends", show(env.get("compile_backends")))
    table.add_row("compile modes", show(env.get("compile_modes")))
    for name, version in (env.get("packages") or {}).items():
        table.add_row(name, show(version))
    recs = Text("\nRecommended:\n", style="bold")
    for rec in env.get("recommendations") or []:
        recs.append(f"  - {rec}\n", style="")
    return Group(table, recs)
