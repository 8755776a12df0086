"""Threads on a machine other processes keep busy (kiln.cpu.busy), with injected load readings."""

from __future__ import annotations

import pytest
from tests.cpu.test_cpu_threads import _fake_sysfs

from kiln.advise.static import check_cpu_threads
from kiln.config import load_config
from kiln.config.schema import CpuConfig
from kiln.cpu.busy import LoadReading, free_cores, oversubscribed, read_load, threads_under_load
from kiln.cpu.threads import plan_cpu

BUSY_2_CORES = LoadReading(load1=7.9, runnable=9, own_runnable=1, cores=2)  # the issue's machine


@pytest.mark.parametrize(("reading", "others", "busy"), [
    (BUSY_2_CORES, 6.9, 2),
    (LoadReading(0.3, 1, 1, 2), 0.0, 0),                # quiet
    (LoadReading(5.0, 1, 1, 2), 0.0, 0),                # busy a minute ago, quiet now: the last run ended
    (LoadReading(0.9, 6, 1, 2), 0.0, 0),                # a momentary burst the average does not confirm
    (LoadReading(1.6, 3, 1, 8), 0.6, 1),                # 0.6 of a core: counts (over half)
    (LoadReading(1.4, 3, 1, 8), 0.4, 0),                # 0.4 of a core: does not
    (LoadReading(3.0, 4, 3, 8), 0.0, 0),                # the load is this process's own threads
])
def test_other_processes_work_in_cores(reading, others, busy):
    assert reading.others == pytest.approx(others)
    assert reading.busy_cores == busy


def test_threads_on_the_issue_machine():
    assert free_cores(BUSY_2_CORES) == 1
    assert oversubscribed(2, BUSY_2_CORES) and not oversubscribed(1, BUSY_2_CORES)
    assert threads_under_load(2, BUSY_2_CORES) == 1
    quiet = LoadReading(0.2, 1, 1, 2)
    assert threads_under_load(2, quiet) == 2 and not oversubscribed(2, quiet)


def test_the_auto_rule_leaves_busy_cores_to_other_processes(tmp_path):
    topo = _fake_sysfs(tmp_path)  # 8 physical cores
    every = set(range(16))
    load = LoadReading(load1=3.2, runnable=5, own_runnable=1, cores=16)  # 2.2 cores busy elsewhere
    plan = plan_cpu(CpuConfig(), topo, every, load=load)
    assert plan.threads == 6 and "2 left to other processes" in plan.source and "load average 3.20" in plan.source
    assert plan_cpu(CpuConfig(), topo, every, load=LoadReading(0.1, 1, 1, 16)).threads == 8
    # An explicit count is kept, with a note saying what it costs and what would fit.
    explicit = plan_cpu(CpuConfig(threads=8), topo, every, load=load)
    assert explicit.threads == 8 and any("cpu.threads=6" in n for n in explicit.notes)
    # Several ranks of one job would read each other as load: the rule is for a single process.
    assert plan_cpu(CpuConfig(), topo, every, local_world=2, load=load).threads == 4


def test_advise_does_not_say_ok_on_a_busy_machine(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cfg = load_config(None, ["training.device=cpu"])
    busy = LoadReading(load1=40.0, runnable=64, own_runnable=1, cores=64)
    finding = check_cpu_threads(cfg, busy)
    assert finding.status == "advice"
    assert "load average 40.00" in finding.finding and finding.measured["load1"] == 40.0
    quiet = check_cpu_threads(cfg, LoadReading(0.0, 1, 1, 64))
    assert "load average" not in quiet.finding


def test_reading_the_load_here():
    reading = read_load()
    if reading is None:
        pytest.skip("no /proc/loadavg")
    assert reading.cores >= 1 and reading.own_runnable >= 1 and reading.load1 >= 0
