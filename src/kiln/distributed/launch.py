"""`kiln train --nproc-per-node N ...`: check the job here, then hand it to torchrun.

torchrun (torch.distributed.run) starts the ranks, sets RANK/WORLD_SIZE/..., and with
`--max-restarts K` its elastic agent restarts the whole group when a rank dies. Each rank runs
`python -m kiln train` with the same config and run dir, exactly what `torchrun -m kiln train`
would run by hand. Bad input is rejected in this parent process first, so it exits 2 once
instead of N ranks failing in parallel. torchrun runs through `kiln.distributed.agent`, which
hands the failed ranks back (`launch` returns them) so the caller can name the first failure.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from kiln.distributed.signal_relay import SignalRelay
from kiln.errors import ConfigError
from kiln.failure.ranks import REPORT_ENV, RankFailure, load_failures
from kiln.safe_io import open_truncate


@dataclass(frozen=True)
class LaunchSpec:
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    max_restarts: int = 0
    rdzv_wait_s: float = 30.0


def _local_addresses() -> set[str]:
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()}
    with contextlib.suppress(OSError):  # an unresolvable own hostname: the names above remain
        names |= {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    return names


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError("--rdzv-endpoint", f"{endpoint!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _is_local(host: str) -> bool:
    if host in _local_addresses():
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_endpoint(host: str, port: int, *, must_listen_here: bool, wait_s: float) -> None:
    """Fail fast on an endpoint that can never work: a name that does not resolve, rank 0 on a
    machine that is not the endpoint, or (other ranks) nothing listening within `wait_s`."""
    try:
        socket.getaddrinfo(host, port)
    except OSError as exc:
        raise ConfigError("--rdzv-endpoint", f"{host}:{port} does not resolve: {exc}") from None
    if must_listen_here:
        if not _is_local(host):
            raise ConfigError("--rdzv-endpoint", f"node rank 0 hosts the rendezvous, but {host} is not this machine")
        return
    deadline = time.monotonic() + wait_s
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, wait_s)):
                return
        except OSError as exc:
            last = exc
            time.sleep(0.5)
    raise ConfigError("--rdzv-endpoint", f"{host}:{port} is unreachable after {wait_s:.0f} s ({last}); "
                      "start node rank 0 first and check the address and firewall")


def uses_gpu(device_choice: str) -> bool:
    return device_choice.startswith("cuda") or (device_choice == "auto" and torch.cuda.is_available())


def check_launch(spec: LaunchSpec, device_choice: str) -> None:
    if spec.nproc_per_node < 1:
        raise ConfigError("--nproc-per-node", f"must be >= 1, got {spec.nproc_per_node}")
    if spec.nnodes < 1:
        raise ConfigError("--nnodes", f"must be >= 1, got {spec.nnodes}")
    if spec.max_restarts < 0:
        raise ConfigError("--max-restarts", f"must be >= 0, got {spec.max_restarts}")
    if uses_gpu(device_choice):
        visible = torch.cuda.device_count()
        if spec.nproc_per_node > visible:
            raise ConfigError("--nproc-per-node", f"{spec.nproc_per_node} processes but {visible} visible GPUs "
                              "(one GPU per process)", [str(i) for i in range(1, visible + 1)])
    if spec.nnodes > 1:
        if not spec.rdzv_endpoint:
            raise ConfigError("--rdzv-endpoint", "several nodes need a rendezvous endpoint HOST:PORT")
        if spec.node_rank is None:
            raise ConfigError("--node-rank", "several nodes need this node's rank (0 on the endpoint's host)")
        if not 0 <= spec.node_rank < spec.nnodes:
            raise ConfigError("--node-rank", f"must be in [0, {spec.nnodes}), got {spec.node_rank}")
    if spec.rdzv_endpoint:
        host, port = parse_endpoint(spec.rdzv_endpoint)
        check_endpoint(host, port, must_listen_here=(spec.node_rank or 0) == 0, wait_s=spec.rdzv_wait_s)


def torchrun_argv(spec: LaunchSpec, kiln_args: list[str]) -> list[str]:
    """The torchrun argv (through kiln's agent, which hands rank failures back) that runs
    `python -m kiln KILN_ARGS...` on every rank. One node: a private rendezvous on a free local
    port (`--standalone`). Several nodes: static rendezvous at the endpoint with explicit node
    ranks, which is what `--node-rank` means to torchrun (the c10d backend would assign ranks)."""
    cmd = [sys.executable, "-m", "kiln.distributed.agent", f"--nproc-per-node={spec.nproc_per_node}",
           f"--max-restarts={spec.max_restarts}"]
    if spec.nnodes == 1 and not spec.rdzv_endpoint:
        cmd.append("--standalone")
    else:
        host, port = parse_endpoint(spec.rdzv_endpoint)
        cmd += [f"--nnodes={spec.nnodes}", f"--node-rank={spec.node_rank or 0}",
                f"--master-addr={host}", f"--master-port={port}"]
    return [*cmd, "-m", "kiln", *kiln_args]


def torchrun_command(spec: LaunchSpec, run_dir: Path, train_args: list[str]) -> list[str]:
    """The torchrun argv of `kiln train --run-dir RUN_DIR TRAIN_ARGS...` on every rank."""
    return torchrun_argv(spec, ["train", "--run-dir", str(run_dir), *train_args])


def _stop(proc: subprocess.Popen, grace_s: float = 45.0) -> None:
    """End torchrun and its ranks. torchrun runs each rank in a session of its own, so only it can
    reach them: SIGTERM makes it pass the signal on (a kiln rank then stops at its next step) and,
    after its own 30 s, kill them. Only if torchrun itself does not end is its group killed."""
    import signal

    with contextlib.suppress(ProcessLookupError):  # it ended just now: nothing to stop
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        _wait_group_gone(proc.pid)


def _wait_group_gone(pgid: int, timeout_s: float = 30.0) -> None:
    """Return once no process of group `pgid` is still running (zombies waiting for their parent to
    reap them hold nothing), or after `timeout_s`. SIGKILL to a group is delivered asynchronously:
    on a loaded machine a member can run on for a moment, and the caller's next measurement must
    not share the GPU with it. Linux only (reads /proc); elsewhere it returns at once."""
    import time

    proc_root = Path("/proc")
    if not proc_root.is_dir():
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = False
        for stat in proc_root.glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # ended while we looked
            if int(fields[2]) == pgid and fields[0] != "Z":
                running = True
                break
        if not running:
            return
        time.sleep(0.05)


def run_bounded(argv: list[str], timeout_s: float, *, env: dict[str, str] | None = None,
                cwd: Path | None = None, grace_s: float = 45.0) -> tuple[int | None, str, str]:
    """(exit code or None when it ran past `timeout_s`, stdout, stderr) of a child that may start
    processes of its own (torchrun's ranks, a compile worker pool). The child gets a session of its
    own and, past its time, is stopped as `_stop` stops torchrun, its whole group killed if need be:
    `subprocess.run(timeout=)` kills only the child, and a rank left running holds the GPU while
    the next measurement runs."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, env=env, cwd=cwd, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc, grace_s=grace_s)
            code = None
        out.seek(0)
        err.seek(0)
        return code, out.read(), err.read()


def launch_kiln(spec: LaunchSpec, kiln_args: list[str], *, timeout_s: float | None = None,
                log_path: Path | None = None, env: dict[str, str] | None = None) -> int:
    """Run `kiln KILN_ARGS...` on every rank through torchrun; 0, or 1 for any failure of the ranks,
    or 124 when it ran past `timeout_s` (then torchrun and its ranks are stopped, as on Ctrl-C). With
    `log_path` the ranks' output goes there instead of this terminal; `env` replaces the environment."""
    argv = torchrun_argv(spec, kiln_args)
    if log_path is None and timeout_s is None:
        return 0 if subprocess.run(argv, check=False, env=env).returncode == 0 else 1
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(os.fdopen(open_truncate(log_path), "w", encoding="utf-8")) if log_path is not None else None
        # A session of its own, so a timeout can end torchrun and every rank it started at once.
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT if log else None, start_new_session=True,
                                env=env)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            return 124
        except BaseException:  # Ctrl-C here: torchrun, in a session of its own, would not see it
            _stop(proc)
            raise
    return 0 if code == 0 else 1


@dataclass(frozen=True)
class LaunchResult:
    code: int
    """0, or 1 for any failure of the ranks."""
    failures: list[RankFailure]
    """On failure, the failed ranks as the agent reported them (empty if it reported none)."""
    stopped_by: str | None = None
    """The stop signal this launcher received and passed on (SIGINT, SIGTERM, SIGHUP), if any."""


def launch(spec: LaunchSpec, run_dir: Path, train_args: list[str],
           env: dict[str, str] | None = None) -> LaunchResult:
    """Run torchrun (with `env` added to the environment) until its ranks end.

    A stop signal this process receives (Ctrl-C, a scheduler's SIGTERM, SIGHUP) is passed on to
    torchrun's agent, which passes it to the ranks; they save a checkpoint and exit 0 and this call
    returns as usual, naming the signal (kiln.distributed.signal_relay). The agent runs in a session of
    its own so that a terminal's Ctrl-C reaches it once, through here, not twice.
    """
    with tempfile.TemporaryDirectory(prefix="kiln-launch-") as reports:
        env = {**os.environ, **(env or {}), REPORT_ENV: reports}
        proc = subprocess.Popen(torchrun_command(spec, run_dir, train_args), env=env, start_new_session=True)
        relay = SignalRelay(forward=proc.send_signal)
        try:
            with relay:
                code = proc.wait()
        except BaseException:  # not a stop signal (the relay takes those): end torchrun and its ranks
            _stop(proc)
            raise
        failures = load_failures(Path(reports)) if code != 0 else []
    return LaunchResult(0 if code == 0 else 1, failures, relay.first)


def launcher_flags(spec: LaunchSpec) -> list[str]:
    """The `kiln train` flags that recreate this launch (for the resume command of a failure)."""
    flags = [f"--nproc-per-node={spec.nproc_per_node}"]
    if spec.nnodes > 1:
        flags += [f"--nnodes={spec.nnodes}", f"--node-rank={spec.node_rank or 0}",
                  f"--rdzv-endpoint={spec.rdzv_endpoint}"]
    if spec.max_restarts:
        flags.append(f"--max-restarts={spec.max_restarts}")
    return flags
