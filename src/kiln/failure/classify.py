"""What failed, in words a user can act on: an exception (and everything it wraps) -> a `Diagnosis`.

A failure rarely arrives as the error that caused it. DCP wraps each rank's write error in a
`CheckpointException` (a BaseException whose `failures` maps rank -> (exception, stack)); kiln wraps
that in `CheckpointSaveError`, with the result of probing the storage when the original errno was
lost (torch.save's zip writer reports a full disk as `enforce fail ... unexpected pos`); the
DataLoader reports a killed worker as a RuntimeError raised from its SIGCHLD handler; a rank whose
peer died sees a gloo/NCCL error that says nothing about the peer's own problem. `diagnose` walks
all of it and names the most specific cause it finds, with advice that uses the run's own settings.
"""

from __future__ import annotations

import errno
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kiln.models.host_memory import gib, host_memory, training_state_bytes

_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
_NO_ACCESS = {errno.EACCES, errno.EPERM, errno.EROFS}
_WORKER = re.compile(r"DataLoader worker \(pids?\(?s?\)? ?([\d, ]+)\)\s*(?:is killed by signal: ([\w ]+)|exited unexpectedly)")
_PEER_LOST = ("connection closed by peer", "connection reset by peer", "broken pipe", "remote process exited",
              "communicator was aborted", "nccl communicator", "process group is shut down", "pg is aborted",
              "connection refused", "socket closed", "recv returned 0")
_TIMEOUT = ("timed out", "timeout", "watchdog caught collective operation timeout")
_LOCATION = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")
DETAIL_CHARS = 240


@dataclass(frozen=True)
class Diagnosis:
    kind: str
    """disk_full, no_access, worker_killed, cuda_oom, host_oom, nonfinite, broken_records, collective_timeout,
    peer_lost, collective, killed, error."""
    what: str
    """A few words: "disk full", "CUDA out of memory", ..."""
    detail: str
    """The deciding error, one line, trimmed: `OSError: [Errno 28] No space left on device: 'path'`."""
    advice: str
    """What to do next, using the run's own settings where they matter."""
    secondary: bool = False
    """The error only says that another rank failed first (its peer died or aborted the collective)."""
    path: str | None = None
    """The file the error names, when it names one."""


def short_error(exc: BaseException, limit: int = DETAIL_CHARS) -> str:
    """`Type: first line of the message`, without C++ source locations, at most `limit` characters."""
    text = str(exc).strip()
    if type(exc).__name__ == "CheckpointException":
        text = text.splitlines()[-1] if text else ""  # str() holds every rank's traceback; the error is last
    first = _LOCATION.sub("", text.splitlines()[0].strip()) if text else ""
    first = first.split(" This is typically caused by")[0]  # gloo's boilerplate after the reason
    out = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return out if len(out) <= limit else out[: limit - 3].rstrip() + "..."


def reason(exc: BaseException) -> str:
    """The shortest honest reason: an OSError's strerror ("No space left on device"), else `short_error`."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else short_error(exc, 160)


def causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and everything it wraps, outermost first, each once: `__cause__`/`__context__`, DCP's
    per-rank failures, kiln's `CheckpointSaveError.cause` and `.storage`."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        inner: list[Any] = [getattr(e, "storage", None), getattr(e, "cause", None)]
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            inner += [v[0] if isinstance(v, tuple) else v for v in failures.values()]
        inner += [e.__cause__, e.__context__]
        todo += [x for x in inner if isinstance(x, BaseException)]


def _signal_of(name: str | None) -> str:
    words = (name or "").strip().rstrip(".").lower()
    return {"killed": "SIGKILL", "segmentation fault": "SIGSEGV", "bus error": "SIGBUS", "aborted": "SIGABRT",
            "terminated": "SIGTERM"}.get(words, name.strip() if name else "")


def _cfg(cfg: Any, dotted: str, default: Any = None) -> Any:
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part, None)
        if value is None:
            return default
    return value


def _oom_advice(cfg: Any) -> str:
    batch, accum = _cfg(cfg, "data.batch_size"), _cfg(cfg, "training.grad_accum_steps", 1)
    if batch and batch > 1:
        first = (f"lower data.batch_size (now {batch}; e.g. data.batch_size={batch // 2} "
                 f"training.grad_accum_steps={accum * 2} keeps the global batch)")
    else:
        first = "lower data.batch_size / data.seq_len"
    policy = _cfg(cfg, "precision.policy", "")
    precision = "" if policy and policy != "fp32" else ", precision.policy=bf16-mixed"
    return (f"{first}{precision}, activation checkpointing in the model (torch.utils.checkpoint), or shard "
            "across GPUs with distributed.strategy=fsdp")


def _disk_advice(cfg: Any, where: str) -> str:
    keep = _cfg(cfg, "checkpoint.keep")
    fewer = f" or keep fewer checkpoints (checkpoint.keep={keep} now)" if keep and keep > 1 else ""
    return f"free space on the filesystem of {where} (df -h {where}){fewer}, or use a --run-dir on a larger disk"


def diagnose(exc: BaseException, *, cfg: Any = None, run_dir: Any = None, model_params: int | None = None) -> Diagnosis:
    """The most specific cause found in `exc` and what it wraps; `cfg` (a kiln Config) and
    `model_params` (the model's parameter count, when built) make the advice concrete, `run_dir`
    names where to look."""
    chain = list(causes(exc))
    where = str(run_dir) if run_dir is not None else "the output directory"
    for e in chain:
        if isinstance(e, OSError) and e.errno in _DISK_FULL:
            what = "disk quota exceeded" if e.errno == errno.EDQUOT else "disk full"
            return Diagnosis("disk_full", what, short_error(e), _disk_advice(cfg, where), path=_path(e))
    for e in chain:
        if isinstance(e, OSError) and e.errno in _NO_ACCESS:
            readonly = e.errno == errno.EROFS
            what = "the filesystem is read-only" if readonly else "permission denied"
            advice = (f"restore write access to {where} (ls -ld {where}; the filesystem may have been remounted "
                      "read-only after errors, see dmesg) or use another --run-dir") if readonly else (
                      f"restore write access to {where} (ls -ld {where}) or use another --run-dir")
            return Diagnosis("no_access", what, short_error(e), advice, path=_path(e))
    for e in chain:
        match = _WORKER.search(str(e)) if isinstance(e, RuntimeError) else None
        if match:
            return _worker_killed(e, match, cfg)
    for e in chain:
        if _lost_loader_worker(e):
            return _worker_killed(e, None, cfg)
    for e in chain:
        if _is_cuda_oom(e):
            return Diagnosis("cuda_oom", "CUDA out of memory", short_error(e, 400), _oom_advice(cfg))
    for e in chain:
        if isinstance(e, MemoryError) or "can't allocate memory" in str(e) or "DefaultCPUAllocator" in str(e):
            return Diagnosis("host_oom", "out of host memory", short_error(e), _host_memory_advice(cfg, e, model_params))
    for e in chain:
        if type(e).__name__ == "NonFiniteError":
            return Diagnosis("nonfinite", "non-finite loss or gradient", short_error(e),
                             "lower optim.lr or add warm-up (optim.warmup_steps), keep training.grad_clip on, prefer "
                             "bf16-mixed over fp16-mixed, or drop bad updates with training.nonfinite=skip")
    for e in chain:
        if type(e).__name__ == "BrokenRecordsError":  # kiln.monitor.records
            return _broken_records(e)
    for e in chain:
        if _is_distributed(e):
            return _collective(e)
    return Diagnosis("error", "error", short_error(_innermost(chain)),
                     "the full traceback is in the log below; if it points into your model, data or factory "
                     "code, fix it there")


def _broken_records(e: BaseException) -> Diagnosis:
    """A damaged line in the middle of a run's JSON-lines file (metrics.jsonl): the file, not the
    user's code, is at fault; say which line and how to get past it."""
    path, line = getattr(e, "path", None), getattr(e, "line", None)
    if path is None or line is None:
        return Diagnosis("broken_records", "a damaged records file", short_error(e),
                         "move the file the error names aside, then run the same command again")
    name, shown = Path(path).name, shlex.quote(str(path))
    keep = (f"keep the {line - 1} line(s) before it (head -n {line - 1} {shown} > {shown}.part && "
            f"mv {shown}.part {shown})") if line > 1 else "remove it"
    return Diagnosis("broken_records", f"line {line} of {name} is damaged", short_error(e),
                     f"line {line} of {path} is not a JSON record (the file was damaged or edited): {keep}, or move it aside (mv {shown} {shown}.damaged; the run's records then start "
                     "afresh), and run the same command again", path=str(path))


def _path(e: OSError) -> str | None:
    return str(e.filename) if e.filename else None


def _innermost(chain: list[BaseException]) -> BaseException:
    """The first error that is not one of kiln's or DCP's wrappers (their messages repeat it)."""
    for e in chain:
        if type(e).__name__ not in ("CheckpointSaveError", "CheckpointException", "RunFailed"):
            return e
    return chain[0]


def _is_cuda_oom(e: BaseException) -> bool:
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None)) if isinstance(t, type))
    return (bool(oom_types) and isinstance(e, oom_types)) or "CUDA out of memory" in str(e)


def _host_memory_advice(cfg: Any, error: BaseException, model_params: int | None) -> str:
    """What holds the host's memory, with numbers: the model's state (weights, and on a CPU run its
    gradients and optimizer state) against the host's memory, the allocation that failed, then
    the data loader; the largest first."""
    total, _ = host_memory()
    facts, advice = [], []
    asked = re.search(r"allocate (\d+) bytes", str(error))
    if asked:
        facts.append(f"the failed allocation asked for {gib(int(asked.group(1)))}")
    if model_params:
        device = str(_cfg(cfg, "training.device", "cpu"))
        state = training_state_bytes(model_params, device_type="cpu" if device == "cpu" else "cuda",
                                     optimizer=str(_cfg(cfg, "optim.name", "adamw")),
                                     momentum=float(_cfg(cfg, "optim.momentum", 0.0) or 0.0))
        facts.append(f"the model's {model_params / 1e6:.1f}M parameters hold {gib(state)}"
                     + (f" of this host's {gib(total)}" if total else ""))
        if total and state > total // 2:
            advice.append("the model itself is the bulk: use a smaller model, or a machine (or GPU) with more memory")
    workers = _cfg(cfg, "data.num_workers") if _cfg(cfg, "data.source", "synthetic") != "synthetic" else 0
    if workers:
        advice.append(f"lower data.num_workers (now {workers}) or data.prefetch_factor")
    advice.append("lower data.batch_size, memory-map large data (data.source=tokens) instead of loading it, "
                  "or run on a machine with more memory")
    return ("; ".join(facts) + ": " if facts else "") + "; ".join(advice)


def _lost_loader_worker(e: BaseException) -> bool:
    """A connection to a DataLoader worker that broke while a batch was handed over (the worker
    died with the batch's shared-memory handle half sent): the traceback runs through torch.utils.data."""
    if not isinstance(e, (ConnectionError, EOFError)):
        return False
    tb = e.__traceback__
    while tb is not None:
        if "/torch/utils/data/" in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
            return True
        tb = tb.tb_next
    return False


def _worker_killed(e: BaseException, match: re.Match | None, cfg: Any) -> Diagnosis:
    sig = _signal_of(match.group(2)) if match else ""
    what = (f"a DataLoader worker was killed ({sig})" if sig else "a DataLoader worker exited unexpectedly" if match
            else "a DataLoader worker died while handing over a batch")
    workers = _cfg(cfg, "data.num_workers")
    fewer = f"lower data.num_workers (now {workers}) or data.prefetch_factor" if workers else \
        "lower data.num_workers or data.prefetch_factor"
    if sig == "SIGBUS":
        advice = ("workers pass batches through shared memory and /dev/shm is too small: enlarge it "
                  f"(docker run --shm-size=8g) or {fewer}")
    elif sig == "SIGKILL":
        advice = (f"SIGKILL is usually the kernel's OOM killer (check dmesg -T | grep -i oom): {fewer}, or give "
                  "the job more host memory; if you killed it yourself, resume")
    else:
        advice = ("a worker that dies without a Python error was killed (often the kernel's OOM killer: "
                  f"dmesg -T | grep -i oom) or crashed in native code (run with data.num_workers=0 to see it "
                  f"in-process); {fewer}")
    return Diagnosis("worker_killed", what, short_error(e), advice)


def _is_distributed(e: BaseException) -> bool:
    name = type(e).__name__
    if name in ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError"):
        return True
    if isinstance(e, OSError):  # a closed pipe or socket of the process itself (`kiln ... | head`)
        return False
    text = str(e).lower()
    return any(m in text for m in ("gloo", "nccl", "processgroup")) or any(m in text for m in _PEER_LOST)


def _collective(e: BaseException) -> Diagnosis:
    text = str(e).lower()
    if any(m in text for m in _PEER_LOST):
        return Diagnosis("peer_lost", "lost contact with another rank", short_error(e),
                         "another rank failed first: its error is the cause (see the launcher's message or that "
                         "rank's error log)", secondary=True)
    if any(m in text for m in _TIMEOUT):
        return Diagnosis("collective_timeout", "a collective timed out", short_error(e),
                         "a rank hung or fell far behind (a dead peer, a slow data loader or storage, a "
                         "deadlock in user code); NCCL runs leave the last collectives in flight_recorder/; raise "
                         "distributed.timeout_s only if the ranks are just slow")
    return Diagnosis("collective", "a collective (gloo/NCCL) failed", short_error(e),
                     "check the other ranks' messages and the network between nodes; NCCL_DEBUG=WARN "
                     "shows NCCL's own reason")


def killed_by_signal(signal_name: str) -> Diagnosis:
    """A process that died of a signal, which leaves no Python error behind."""
    if signal_name == "SIGKILL":
        advice = ("no Python error: SIGKILL is usually the kernel's OOM killer (check dmesg -T | grep -i oom); "
                  "lower data.batch_size or data.num_workers, or give the job more host memory")
    elif signal_name == "SIGTERM":
        advice = "it was told to stop (the launcher stops the other ranks after one fails, or a scheduler)"
    elif signal_name == "SIGABRT":
        advice = ("on NCCL this is the watchdog taking the rank down after a collective timed out or a peer "
                  "failed (its [rank N] lines above say which; flight_recorder/ holds the last collectives); "
                  "otherwise a native crash")
    else:
        advice = f"a native crash ({signal_name}): that rank's output above shows where; retry once to rule out a flaky node"
    return Diagnosis("killed", f"killed by {signal_name}", "", advice, secondary=signal_name == "SIGTERM")
