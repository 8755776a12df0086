"""The checks of `kiln advise` that need no training run: graph breaks (kiln explain), DDP vs FSDP
fit (kiln's strategy sizing), CPU threads (kiln's CPU plan)."""

from __future__ import annotations

import os
from typing import Any

import torch

from kiln.advise.findings import Finding, gib
from kiln.config.schema import Config
from kiln.cpu.busy import LoadReading, read_load
from kiln.cpu.threads import plan_cpu
from kiln.cpu.topology import process_affinity, read_topology
from kiln.train.strategy import STATE_BUDGET, device_memory_bytes, training_state_bytes


def check_graph_breaks(report: dict[str, Any], cfg: Config) -> Finding:
    """From a `kiln explain` report of the model on its example inputs."""
    title = "graph breaks (torch.compile)"
    breaks = report.get("breaks") or []
    runs = report.get("runs") or []
    if runs and runs[0].get("status") == "error":
        return Finding("graph_breaks", title, "advice", f"the model fails under torch.compile: {runs[0].get('error')}",
                       "kiln doctor TARGET finds the compiler stage that fails and writes a repro")
    recompiles = report.get("recompiles") or []
    if not breaks:
        extra = f"; {len(recompiles)} recompile(s): see kiln explain" if recompiles else ""
        return Finding("graph_breaks", title, "ok" if not recompiles else "advice",
                       f"one graph ({report.get('graph_count')} traced), no breaks{extra}",
                       "kiln explain TARGET --vary batch shows the failing guards" if recompiles else None,
                       measured={"graph_count": report.get("graph_count"), "recompiles": len(recompiles)})
    skipped = report.get("frames_skipped") or 0
    where = "; ".join(f"{b['category']} at {os.path.basename(b['file'] or '?')}:{b['line']}" for b in breaks[:4])
    finding = (f"{len(breaks)} graph break(s) in {report.get('graph_count')} graph(s): {where}"
               + (" ..." if len(breaks) > 4 else ""))
    if skipped:
        finding += f"; {skipped} function(s) left entirely eager (a break inside a loop or `with`)"
    fixes = []
    for b in breaks:
        if b["hint"] not in fixes:
            fixes.append(b["hint"])
    fix = " | ".join(fixes[:3]) + ("" if cfg.compile.fullgraph else "; then compile.fullgraph=true keeps it that way")
    details = [{k: b.get(k) for k in ("category", "reason", "file", "line", "code", "hint", "frame_skipped")}
               for b in breaks]
    return Finding("graph_breaks", title, "advice", finding, fix,
                   measured={"graph_count": report.get("graph_count"), "graph_breaks": len(breaks),
                             "frames_skipped": skipped}, details=details)


def check_strategy(cfg: Config, num_params: int, param_bytes: int, device: torch.device) -> Finding:
    """Would the training state fit DDP (a full replica per device) or need FSDP (sharded)?"""
    title = "DDP vs FSDP fit"
    state = training_state_bytes(num_params, param_bytes, cfg.optim.name)
    memory = device_memory_bytes(device)
    chosen = cfg.distributed.strategy
    measured = {"num_params": num_params, "training_state_bytes": state, "device_memory_bytes": memory}
    if memory is None:
        return Finding("strategy", title, "ok", f"training state {gib(state)} (parameters + gradients + optimizer "
                       "state); CPU ranks replicate it with DDP over gloo", measured=measured)
    gpus = torch.cuda.device_count()
    share = state / memory
    if state <= STATE_BUDGET * memory:
        finding = f"training state {gib(state)} = {share:.0%} of one {memory / 2**30:.0f} GiB GPU: a full replica fits"
        if chosen == "fsdp":
            return Finding("strategy", title, "advice", finding + "; the config shards it anyway",
                           "distributed.strategy=ddp (or auto): DDP gathers no parameters and communicates once per step",
                           measured=measured)
        return Finding("strategy", title, "ok", finding + ("; several processes use DDP" if gpus > 1 else ""),
                       measured=measured)
    sharded = state / max(gpus, 1)
    finding = (f"training state {gib(state)} = {share:.0%} of one {memory / 2**30:.0f} GiB GPU: too much for a "
               f"replica (kiln keeps it under {STATE_BUDGET:.0%}); sharded over {gpus} GPU(s) {gib(int(sharded))} each")
    if chosen == "ddp":
        return Finding("strategy", title, "advice", finding + "; the config asks for DDP",
                       "distributed.strategy=fsdp (or auto): FSDP2 shards parameters, gradients and optimizer state",
                       measured=measured)
    fix = None if gpus > 1 else ("one GPU cannot hold it: kiln train --nproc-per-node N distributed.strategy=fsdp on "
                                 "several GPUs, or precision.policy=bf16-true (half the parameter bytes)")
    return Finding("strategy", title, "advice" if fix else "ok", finding, fix, measured=measured)


def check_cpu_threads(cfg: Config, load: LoadReading | None | bool = True) -> Finding:
    """Threads and pinning as kiln train would choose them, judged against the machine's load
    (`load`: a reading; True reads it now; None ignores it)."""
    title = "CPU threads and pinning"
    if load is True:
        load = read_load()
    topo = read_topology()
    plan = plan_cpu(cfg.cpu, topo, process_affinity(), omp_env=os.environ.get("OMP_NUM_THREADS"), load=load or None)
    auto = plan_cpu(type(cfg.cpu)(bind=cfg.cpu.bind), topo, process_affinity(), load=load or None)
    measured = {"threads": plan.threads, "source": plan.source, "auto_threads": auto.threads,
                "physical_cores": topo.physical_cores, "numa_nodes": len(topo.nodes)}
    if load:
        measured.update(load1=load.load1, runnable=load.runnable, other_cores_busy=load.others)
    problems = plan.notes + plan.hints
    if problems:
        return Finding("cpu_threads", title, "advice", f"{plan.threads} intra-op threads ({plan.source}): "
                       + "; ".join(problems), f"cpu.threads={auto.threads} (or cpu.threads=0 with OMP_NUM_THREADS "
                       "unset: kiln's auto rule, which reads the load when the run starts)", measured=measured)
    finding = f"{plan.threads} intra-op threads ({plan.source})"
    if load and load.busy_cores > 0:
        if "other processes" not in plan.source:  # else the source says it already
            finding = f"the machine is busy: {load.describe()}; " + finding
        return Finding("cpu_threads", title, "advice", finding,
                       "run when the machine is quiet (every step of this run shares its cores), or keep "
                       f"cpu.threads={plan.threads} to hold this count", measured=measured)
    if len(topo.nodes) > 1 and cfg.cpu.bind == "none":
        return Finding("cpu_threads", title, "advice", finding + f"; {len(topo.nodes)} NUMA nodes, no pinning",
                       f"kiln train --nproc-per-node {len(topo.nodes)} cpu.bind=numa", measured=measured)
    return Finding("cpu_threads", title, "ok", finding, measured=measured)
