"""Intra-op threads and core/NUMA pinning for a CPU run, per rank.

The rule (Intel's and PyTorch's CPU performance guides): one compute thread per *physical* core
(hyperthread siblings share the core's vector units and only add contention), all ranks on a node
together never using more cores than the process may run on, and each rank's threads kept on its
own cores, one NUMA node's where possible (memory is allocated on first touch, so pinned threads
keep their data on their node).

The thread count must be set before the first parallel op and before compiling: inductor's C++
kernels are generated for the thread count torch reports at compile time.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from kiln.config.schema import CpuConfig
from kiln.cpu.busy import LoadReading, oversubscribed, read_load, threads_under_load
from kiln.cpu.topology import CpuTopology, format_cpulist, process_affinity, read_topology

log = logging.getLogger("kiln.cpu")

# Set by `kiln train --nproc-per-node` next to the OMP_NUM_THREADS it chose for the ranks (so that
# torchrun does not set 1): the ranks then apply their own auto rule instead of reading it back.
LAUNCHER_ENV = "KILN_CPU_THREADS_FROM_LAUNCHER"


@dataclass
class CpuPlan:
    threads: int
    """Intra-op threads for torch.set_num_threads."""
    cpus: list[int] | None
    """Logical CPUs to pin this process to, or None to leave its affinity alone."""
    source: str
    """Why this many threads: `cpu.threads`, `OMP_NUM_THREADS`, or the auto rule."""
    bind: str = "none"
    notes: list[str] = field(default_factory=list)
    """Warnings (oversubscription, too few cores to split)."""
    hints: list[str] = field(default_factory=list)
    """Information (cores left idle by an explicit setting)."""

    def describe(self) -> dict:
        return {"threads": self.threads, "bind": self.bind,
                "cpus": format_cpulist(self.cpus) if self.cpus is not None else None,
                "source": self.source, "notes": list(self.notes), "hints": list(self.hints)}


def _split(items: list[int], parts: int, index: int) -> list[int]:
    """Contiguous share `index` of `parts` nearly equal shares (the first shares take the remainder)."""
    base, extra = divmod(len(items), parts)
    start = index * base + min(index, extra)
    return items[start:start + base + (1 if index < extra else 0)]


def _pinned_cpus(topo: CpuTopology, physical: list[int], bind: str, local_rank: int, local_world: int,
                 notes: list[str]) -> list[int]:
    if len(physical) < local_world:
        notes.append(f"{local_world} ranks share {len(physical)} physical cores: some ranks share a core")
        return [physical[local_rank % len(physical)]]
    if bind == "numa":
        by_node: dict[int, list[int]] = {}
        for cpu in physical:
            by_node.setdefault(topo.node_of.get(cpu, 0), []).append(cpu)
        nodes = list(by_node.values())
        if local_world <= len(nodes):
            return nodes[local_rank]
        # More ranks than nodes: spread the ranks over the nodes, each rank a share of its node.
        per_node = -(-local_world // len(nodes))
        node, slot = divmod(local_rank, per_node)
        ranks_here = min(per_node, local_world - node * per_node)
        if len(nodes[node]) < ranks_here:
            return [nodes[node][slot % len(nodes[node])]]
        return _split(nodes[node], ranks_here, slot)
    return _split(physical, local_world, local_rank)


def plan_cpu(cfg: CpuConfig, topo: CpuTopology, affinity: set[int], *, local_rank: int = 0, local_world: int = 1,
             omp_env: str | None = None, load: LoadReading | None = None) -> CpuPlan:
    """The threads and pinning for rank `local_rank` of `local_world` ranks on this node. With a
    `load` reading (kiln.cpu.busy), the auto rule of a single process leaves out the cores other
    processes keep busy, and an explicit count that oversubscribes them gets a note."""
    notes: list[str] = []
    physical = topo.physical_cpus(affinity) or sorted(affinity) or [0]
    cpus: list[int] | None = None
    if cfg.bind != "none":
        cpus = _pinned_cpus(topo, physical, cfg.bind, local_rank, local_world, notes)
        share = len(cpus)
        rule = f"auto: the {share} physical core{'s' if share != 1 else ''} this rank is pinned to (cpu.bind={cfg.bind})"
    else:
        share = max(1, len(physical) // local_world)
        rule = (f"auto: {len(physical)} physical cores of the process's CPU affinity"
                + (f" / {local_world} ranks on this node" if local_world > 1 else ""))
    if cfg.threads > 0:
        threads, source = cfg.threads, "cpu.threads"
    elif omp_env:
        try:
            threads, source = max(1, int(omp_env)), f"OMP_NUM_THREADS={omp_env}"
        except ValueError:
            notes.append(f"OMP_NUM_THREADS={omp_env!r} is not a number; ignored")
            threads, source = share, rule
    else:
        threads, source = share, rule
    hints: list[str] = []
    if source.startswith("OMP_NUM_THREADS") and threads < share:
        hints.append(f"{source} leaves {share - threads} of this rank's {share} cores idle (torchrun sets 1 when it "
                     f"starts several processes); cpu.threads={share} uses them all")
    if load is not None and local_world == 1:  # sibling ranks would read as other processes' load
        cores = len(cpus) if cpus is not None else len(physical)
        if source == rule and oversubscribed(threads, load, cores):
            fewer = threads_under_load(threads, load, cores)
            source = f"{rule}, {threads - fewer} left to other processes ({load.describe()})"
            threads = fewer
        elif oversubscribed(threads, load, cores):
            notes.append(f"{threads} threads (from {source}) on a machine where {load.describe()}: threads wait for "
                         f"cores and every op waits for them; cpu.threads={threads_under_load(threads, load, cores)}")
    if threads * local_world > len(physical) or (cpus is not None and threads > len(cpus)):
        where = f"the {len(cpus)} pinned cores" if cpus is not None else f"{len(physical)} physical cores"
        total = f"{threads} threads x {local_world} ranks" if local_world > 1 else f"{threads} threads"
        notes.append(f"{total} oversubscribe {where} (from {source}); "
                     f"cpu.threads=0 with OMP_NUM_THREADS unset uses {share}")
    return CpuPlan(threads=threads, cpus=cpus, source=source, bind=cfg.bind, notes=notes, hints=hints)


def launcher_env(cfg: CpuConfig, nproc: int) -> dict[str, str]:
    """Environment for `nproc` CPU ranks started by torchrun: unless the user set OMP_NUM_THREADS,
    the auto rule's per-rank count (torchrun would set 1 for every rank), marked as kiln's choice."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    plan = plan_cpu(cfg, read_topology(), process_affinity(), local_rank=0, local_world=nproc)
    return {"OMP_NUM_THREADS": str(plan.threads), LAUNCHER_ENV: "1"}


def apply_cpu_plan(plan: CpuPlan) -> None:
    import torch

    if plan.cpus is not None:
        os.sched_setaffinity(0, plan.cpus)
    if torch.get_num_threads() != plan.threads:
        torch.set_num_threads(plan.threads)


def configure_cpu(cfg: CpuConfig, *, local_rank: int = 0, local_world: int = 1) -> CpuPlan:
    """Plan, apply and log the threads and pinning of this process (a CPU run)."""
    omp = None if os.environ.get(LAUNCHER_ENV) else os.environ.get("OMP_NUM_THREADS")
    plan = plan_cpu(cfg, read_topology(), process_affinity(), local_rank=local_rank, local_world=local_world,
                    omp_env=omp, load=read_load() if local_world == 1 else None)
    apply_cpu_plan(plan)
    pinned = f", pinned to CPUs {format_cpulist(plan.cpus)}" if plan.cpus is not None else ""
    log.info("cpu: %d intra-op threads (%s)%s", plan.threads, plan.source, pinned)
    for note in plan.notes:
        log.warning("cpu: %s", note)
    for hint in plan.hints:
        log.info("cpu: %s", hint)
    return plan


@contextlib.contextmanager
def cpu_settings(cfg: CpuConfig) -> Iterator[CpuPlan]:
    """`configure_cpu` for the duration of a block (benchmarks, autotune, advise), restoring the
    thread count and CPU affinity afterwards."""
    import torch

    threads, affinity = torch.get_num_threads(), process_affinity()
    try:
        yield configure_cpu(cfg)
    finally:
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)
