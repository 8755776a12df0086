"""What `kiln env` says about the CPU: topology, instruction sets, threads, launchers, advice."""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any

from kiln.config.schema import CpuConfig
from kiln.cpu.busy import read_load
from kiln.cpu.threads import plan_cpu
from kiln.cpu.topology import format_cpulist, process_affinity, read_topology


def _torchrun_numa_binding() -> bool:
    """torchrun has `--numa-binding` (torch >= 2.9): it pins each rank near its GPU."""
    return importlib.util.find_spec("torch.numa") is not None


def cpu_env() -> dict[str, Any]:
    """JSON-friendly facts about this CPU and kiln's plan for a one-process CPU run on it."""
    import torch

    topo = read_topology()
    affinity = process_affinity()
    load = read_load()
    plan = plan_cpu(CpuConfig(), topo, affinity, omp_env=os.environ.get("OMP_NUM_THREADS"), load=load)
    try:
        import torch._inductor.config as inductor_config

        inductor_backend = getattr(inductor_config, "cpu_backend", "cpp")
    except Exception:
        inductor_backend = None
    return {
        **topo.describe(),
        "affinity": format_cpulist(affinity),
        "affinity_physical_cores": len(topo.physical_cpus(affinity)),
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "kiln_threads": plan.threads,
        "kiln_threads_source": plan.source,
        "load1": load.load1 if load else None,
        "runnable_threads": load.runnable if load else None,
        "other_cores_busy": load.others if load else None,
        "mkldnn": torch.backends.mkldnn.is_available(),
        "inductor_cpu_backend": inductor_backend,
        "launchers": {
            "run_cpu": importlib.util.find_spec("torch.backends.xeon.run_cpu") is not None,
            "numactl": shutil.which("numactl"),
            "taskset": shutil.which("taskset"),
            "torchrun_numa_binding": _torchrun_numa_binding(),
        },
    }


def cpu_recommendations(cpu: dict[str, Any], has_gpu: bool, cxx: str | None) -> list[str]:
    recs: list[str] = []
    nodes = len(cpu["numa_nodes"])
    cores = cpu["affinity_physical_cores"]
    if not has_gpu:
        recs.append(f"cpu.threads=0 (auto): {cpu['kiln_threads']} intra-op threads here ({cpu['kiln_threads_source']}); "
                    "with N ranks per node each gets its share, never more threads than physical cores")
        if cpu["threads_per_core"] > 1:
            recs.append(f"{cpu['threads_per_core']:g} hardware threads per core: kiln counts physical cores; "
                        "hyperthreads share vector units and only add contention")
        if nodes > 1:
            recs.append(f"{nodes} NUMA nodes: kiln train --nproc-per-node {nodes} cpu.bind=numa (one gloo rank per node, "
                        "its threads and memory on that node)")
        elif cores >= 8:
            recs.append("cpu.bind=cores keeps each rank's threads on its own cores (no migration between cores)")
        if cpu["native_bf16"]:
            recs.append("precision.policy=bf16-mixed on this CPU: " + ("AMX" if "amx_bf16" in cpu["isa"] else "AVX512-BF16")
                        + " runs bf16 matmuls natively (check the loss: bf16 changes the numerics)")
        else:
            recs.append("keep precision.policy=fp32 on this CPU: no native bf16 (AMX/AVX512-BF16), bf16 would be emulated")
        if cxx and cpu.get("inductor_cpu_backend") == "cpp":
            recs.append(f"compile.enabled=true: inductor's C++/OpenMP backend, vectorised for {cpu['torch_capability']}; "
                        "kiln autotune measures whether it pays for your model")
        launchers = cpu["launchers"]
        if launchers["run_cpu"]:
            binder = "numactl" if launchers["numactl"] else "taskset" if launchers["taskset"] else None
            if binder:
                recs.append(f"torch's CPU launcher also preloads Intel OpenMP and jemalloc/tcmalloc where installed: "
                            f"python -m torch.backends.xeon.run_cpu --no-python --node-id 0 kiln train ... (binds with "
                            f"{binder}; kiln keeps the cores and OMP_NUM_THREADS it sets; it does not pass the exit code on)")
    elif nodes > 1 and cpu["launchers"]["torchrun_numa_binding"]:
        recs.append(f"{nodes} NUMA nodes: distributed.bind_numa=true pins each rank to the CPUs nearest its GPU")
    return recs
