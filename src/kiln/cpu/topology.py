"""The CPU this process runs on: sockets, physical cores, NUMA nodes, instruction sets.

Read from Linux sysfs (`/sys/devices/system/cpu`, `/sys/devices/system/node`) and
`/proc/cpuinfo`, the same facts `lscpu --parse=CPU,Core,Socket,Node` prints (what torch's own CPU
launcher, torch.backends.xeon.run_cpu, reads). Where sysfs is missing (containers that hide it,
other systems), each logical CPU counts as its own core on socket 0, node 0: the plan stays safe
(never more threads than logical CPUs), only less exact.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

# Instruction-set flags (as /proc/cpuinfo names them) that decide CPU speed for training:
# AVX-512 widens every vectorised kernel, AVX512-BF16 and AMX run bf16 matmuls natively.
NOTABLE_ISA = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
               "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "asimd", "sve", "sve2", "bf16")


def parse_cpulist(text: str) -> list[int]:
    """`0-3,8,10-11` -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return sorted(set(out))


def format_cpulist(cpus: list[int] | set[int]) -> str:
    """[0, 1, 2, 3, 8] -> `0-3,8`."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    start = prev = None
    for cpu in ordered + [None]:
        if start is not None and (cpu is None or cpu != prev + 1):
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if cpu is not None and start is None:
            start = cpu
        prev = cpu
    return ",".join(ranges)


@dataclass(frozen=True)
class CpuTopology:
    cpus: tuple[int, ...]
    """Online logical CPUs."""
    core_of: dict[int, tuple[int, int]]
    """Logical CPU -> (socket, core id): CPUs with the same pair are hyperthreads of one core."""
    node_of: dict[int, int]
    """Logical CPU -> NUMA node."""
    flags: frozenset[str] = field(default_factory=frozenset)
    """Instruction-set flags from /proc/cpuinfo."""
    source: str = "sysfs"
    """`sysfs`, or `fallback` when the topology could not be read (one core per logical CPU)."""

    @property
    def sockets(self) -> int:
        return len({socket for socket, _ in self.core_of.values()}) or 1

    @property
    def nodes(self) -> dict[int, list[int]]:
        """NUMA node -> its logical CPUs."""
        out: dict[int, list[int]] = {}
        for cpu in self.cpus:
            out.setdefault(self.node_of.get(cpu, 0), []).append(cpu)
        return dict(sorted(out.items()))

    @property
    def physical_cores(self) -> int:
        return len(set(self.core_of[c] for c in self.cpus))

    def physical_cpus(self, allowed: set[int] | list[int] | None = None) -> list[int]:
        """One logical CPU per physical core among `allowed` (default: all), the lowest-numbered
        sibling, ordered by NUMA node then CPU number: binding and thread counts use these, so a
        thread never shares a core with another one of ours."""
        allowed_set = set(self.cpus if allowed is None else allowed) & set(self.cpus)
        first: dict[tuple[int, int], int] = {}
        for cpu in sorted(allowed_set):
            first.setdefault(self.core_of[cpu], cpu)
        return sorted(first.values(), key=lambda c: (self.node_of.get(c, 0), c))

    @property
    def isa(self) -> list[str]:
        return [name for name in NOTABLE_ISA if name in self.flags]

    @property
    def native_bf16(self) -> bool:
        """bf16 matmuls run natively (AMX, AVX512-BF16, or Arm BF16), not emulated through fp32."""
        return bool({"amx_bf16", "avx512_bf16", "bf16"} & self.flags)

    def describe(self) -> dict:
        """JSON-friendly summary (for `kiln env` and results files)."""
        return {
            "sockets": self.sockets,
            "physical_cores": self.physical_cores,
            "logical_cpus": len(self.cpus),
            "threads_per_core": round(len(self.cpus) / max(1, self.physical_cores), 2),
            "numa_nodes": {str(node): format_cpulist(cpus) for node, cpus in self.nodes.items()},
            "isa": self.isa,
            "native_bf16": self.native_bf16,
            "source": self.source,
        }


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _cpu_flags(cpuinfo: Path) -> frozenset[str]:
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() in ("flags", "features"):  # x86 calls it flags, Arm features
                return frozenset(value.split())
    return frozenset()


def read_topology(sys_root: str | Path = "/sys/devices/system", cpuinfo: str | Path = "/proc/cpuinfo") -> CpuTopology:
    root = Path(sys_root)
    flags = _cpu_flags(Path(cpuinfo))
    try:
        cpus = parse_cpulist((root / "cpu" / "online").read_text())
    except (OSError, ValueError):
        cpus = []
    if not cpus:
        count = os.cpu_count() or 1
        return CpuTopology(tuple(range(count)), {c: (0, c) for c in range(count)}, dict.fromkeys(range(count), 0),
                           flags, "fallback")
    core_of: dict[int, tuple[int, int]] = {}
    complete = True
    for cpu in cpus:
        topo = root / "cpu" / f"cpu{cpu}" / "topology"
        socket, core = _read_int(topo / "physical_package_id"), _read_int(topo / "core_id")
        if socket is None or core is None:
            complete = False
            socket, core = 0, cpu
        core_of[cpu] = (max(socket, 0), core)
    node_of: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for node_dir in sorted((root / "node").glob("node[0-9]*")):
            with contextlib.suppress(OSError, ValueError):
                for cpu in parse_cpulist((node_dir / "cpulist").read_text()):
                    node_of[cpu] = int(node_dir.name[4:])
    for cpu in cpus:
        node_of.setdefault(cpu, 0)
    return CpuTopology(tuple(cpus), core_of, node_of, flags, "sysfs" if complete else "fallback")


def process_affinity() -> set[int]:
    """Logical CPUs this process may run on (a launcher, taskset, numactl or a container may
    have narrowed it)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))
