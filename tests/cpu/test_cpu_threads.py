"""CPU topology from sysfs, the per-rank thread/pinning plan, and its use by kiln train."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kiln.config import load_config
from kiln.config.schema import CpuConfig
from kiln.cpu import threads as cpu_threads
from kiln.cpu.threads import plan_cpu
from kiln.cpu.topology import format_cpulist, parse_cpulist, read_topology
from kiln.errors import ConfigError


def _fake_sysfs(tmp_path, sockets=2, cores=4, smt=2, flags="fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile"):
    """A machine of `sockets` sockets (one NUMA node each) x `cores` cores x `smt` hyperthreads,
    numbered like Linux does: CPU n and n + sockets*cores are siblings."""
    root = tmp_path / "sys"
    total = sockets * cores * smt
    (root / "cpu").mkdir(parents=True)
    (root / "cpu" / "online").write_text(f"0-{total - 1}\n")
    nodes: dict[int, list[int]] = {}
    for cpu in range(total):
        physical = cpu % (sockets * cores)
        socket, core = divmod(physical, cores)
        topo = root / "cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{socket}\n")
        (topo / "core_id").write_text(f"{core}\n")
        nodes.setdefault(socket, []).append(cpu)
    for node, cpus in nodes.items():
        (root / "node" / f"node{node}").mkdir(parents=True)
        (root / "node" / f"node{node}" / "cpulist").write_text(format_cpulist(cpus) + "\n")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: Fake Xeon\nflags\t\t: {flags}\n")
    return read_topology(root, cpuinfo)


def test_cpulist_round_trip():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"


def test_topology_counts_physical_cores_and_nodes(tmp_path):
    topo = _fake_sysfs(tmp_path)
    info = topo.describe()
    assert (info["sockets"], info["physical_cores"], info["logical_cpus"]) == (2, 8, 16)
    assert info["numa_nodes"] == {"0": "0-3,8-11", "1": "4-7,12-15"}
    assert info["native_bf16"] and "amx_bf16" in info["isa"]
    # One CPU per core, node 0's first: hyperthread siblings 8..15 never appear.
    assert topo.physical_cpus() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert not _fake_sysfs(tmp_path / "old", flags="fpu avx2").native_bf16


def test_auto_threads_are_physical_cores_shared_by_ranks(tmp_path):
    topo = _fake_sysfs(tmp_path)
    every = set(range(16))
    assert plan_cpu(CpuConfig(), topo, every).threads == 8
    assert plan_cpu(CpuConfig(), topo, every, local_world=3).threads == 2  # 3 x 2 <= 8: never oversubscribed
    # A launcher (taskset, numactl, run_cpu) narrowed the affinity to node 1 with its siblings.
    assert plan_cpu(CpuConfig(), topo, set(range(4, 8)) | set(range(12, 16))).threads == 4


def test_explicit_threads_win_and_oversubscription_is_named(tmp_path):
    topo = _fake_sysfs(tmp_path)
    plan = plan_cpu(CpuConfig(), topo, set(range(16)), omp_env="3")
    assert (plan.threads, plan.source) == (3, "OMP_NUM_THREADS=3")
    assert any("idle" in hint for hint in plan.hints)
    plan = plan_cpu(CpuConfig(threads=6), topo, set(range(16)), local_world=2, omp_env="3")
    assert plan.threads == 6 and plan.source == "cpu.threads"
    assert any("oversubscribe" in note for note in plan.notes)


def test_numa_binding_gives_each_rank_a_node(tmp_path):
    topo = _fake_sysfs(tmp_path)
    every = set(range(16))
    plans = [plan_cpu(CpuConfig(bind="numa"), topo, every, local_rank=r, local_world=2) for r in range(2)]
    assert [p.cpus for p in plans] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [p.threads for p in plans] == [4, 4]
    # Four ranks on two nodes: two per node, each half a node, none crossing nodes.
    plans = [plan_cpu(CpuConfig(bind="numa"), topo, every, local_rank=r, local_world=4) for r in range(4)]
    assert [p.cpus for p in plans] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_core_binding_splits_cores_without_overlap(tmp_path):
    topo = _fake_sysfs(tmp_path)
    plans = [plan_cpu(CpuConfig(bind="cores"), topo, set(range(16)), local_rank=r, local_world=3) for r in range(3)]
    assert [p.cpus for p in plans] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [p.threads for p in plans] == [3, 3, 2]
    many = plan_cpu(CpuConfig(bind="cores"), topo, {0, 1}, local_rank=2, local_world=3)
    assert many.cpus == [0] and any("share" in note for note in many.notes)


def test_launcher_env_sets_per_rank_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = cpu_threads.launcher_env(CpuConfig(), 2)
    assert env[cpu_threads.LAUNCHER_ENV] == "1" and int(env["OMP_NUM_THREADS"]) >= 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert cpu_threads.launcher_env(CpuConfig(), 2) == {}  # the user's own setting stays


def test_bad_cpu_keys_are_config_errors():
    with pytest.raises(ConfigError, match="cpu.bind"):
        load_config(None, ["cpu.bind=socket"])
    with pytest.raises(ConfigError, match="cpu.threads"):
        load_config(None, ["cpu.threads=-1"])


def test_two_gloo_ranks_pinned_to_their_own_cores(tmp_path):
    """kiln train --nproc-per-node 2 cpu.bind=cores on a CPU: rank 0 runs on its own core with
    one thread per core it owns, and says so in summary.json."""
    affinity = sorted(os.sched_getaffinity(0))
    if len(read_topology().physical_cpus(affinity)) < 2:
        pytest.skip("needs two physical cores")
    run_dir = tmp_path / "pinned"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run(
        [sys.executable, "-m", "kiln", "train", "--nproc-per-node", "2", "--run-dir", str(run_dir),
         "model.kwargs.hidden_size=16", "model.kwargs.num_layers=1", "data.batch_size=4", "training.steps=2",
         "training.log_interval=1", "training.device=cpu", "metrics.console=false", "metrics.tensorboard=false",
         "checkpoint.save_final=false", "cpu.bind=cores"],
        capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cpu = json.loads((run_dir / "summary.json").read_text())["cpu"]
    physical = read_topology().physical_cpus(affinity)
    assert cpu["bind"] == "cores"
    assert parse_cpulist(cpu["cpus"]) == physical[: len(physical) // 2]
    assert cpu["threads"] == len(physical) // 2
