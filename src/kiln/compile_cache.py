"""Compile caches: where inductor keeps compiled kernels, and torch's portable cache artifacts.

- `compile_cache_dir`: inductor's and Triton's on-disk caches live in kiln's cache dir
  (`$KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln/compile`, else `~/.cache/kiln/compile`) rather
  than torch's default under /tmp, which a reboot or a fresh container empties. A
  TORCHINDUCTOR_CACHE_DIR the user set is respected.
- `cache_use`: what a block of work (an engine's first call, a server's warm-up of one variant)
  took from those caches and what it built anew: inductor graphs, and the Triton kernels this
  process compiled or loaded (kiln's own kernels, an autotuner's candidates), with their compile
  seconds: why a warm-up took the time it did.
- Mega-cache artifacts (`torch.compiler.save_cache_artifacts` / `load_cache_artifacts`, torch >=
  2.7): everything the compile put into inductor's, AOTAutograd's and autotuning caches, in one
  blob that kiln saves with a run (`compile_cache.bin`) and loads before a resume or an elastic
  restart, so the restarted process skips most of the compile.

The artifacts are pickles that torch unpickles (on load and again while compiling), so a
`compile_cache.bin` is loaded only when kiln itself wrote it: the file carries an HMAC of its bytes
under this user's secret key, which lives outside any run dir (kiln.signing). A file copied from
another user or machine, or altered, is not loaded (the compile runs cold) and nothing of it is
interpreted. An artifact whose key would place it outside the cache dir (an absolute path, `..`)
is refused as well.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.safe_io import write_atomic
from kiln.signing import UntrustedFileError, config_dir, key_problem, sign, verify

log = logging.getLogger("kiln.compile")

ARTIFACTS_FILE = "compile_cache.bin"
_ENV = "TORCHINDUCTOR_CACHE_DIR"
_PURPOSE = b"kiln compile_cache.bin v1"


class UnsafeArtifactError(ValueError):
    """A cache artifact whose key would write outside the cache dir."""


def kiln_cache_dir() -> Path:
    if os.environ.get("KILN_CACHE_DIR"):
        return Path(os.environ["KILN_CACHE_DIR"]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kiln" / "compile"


def _user_cache_dir() -> str | None:
    """TORCHINDUCTOR_CACHE_DIR as the user set it; None when unset or when it is torch's default
    (inductor writes its default into the environment the first time it asks)."""
    value = os.environ.get(_ENV)
    if not value:
        return None
    with contextlib.suppress(ImportError, AttributeError):
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        if os.path.abspath(value) == os.path.abspath(default_cache_dir()):
            return None
    return value


@contextlib.contextmanager
def compile_cache_dir(spec: str) -> Iterator[Path | None]:
    """Point inductor's cache at `spec` (a path), kiln's dir (empty) or leave torch's (`torch`)
    for the duration of the block; yields the directory in use (None for torch's default)."""
    if spec == "torch" or (not spec and _user_cache_dir()):
        yield Path(os.environ[_ENV]) if os.environ.get(_ENV) else None
        return
    path = Path(spec).expanduser() if spec else kiln_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    old = os.environ.get(_ENV)
    os.environ[_ENV] = str(path.resolve())
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop(_ENV, None)
        else:
            os.environ[_ENV] = old


@dataclass
class CacheUse:
    """What a block of work found in the compile caches and what it built: inductor's graphs (its
    FX graph cache), with dynamo's tracing and inductor's (compile or load) seconds, and the Triton
    kernels compiled in this process (Triton's on-disk cache), named. The kernels inductor compiles
    in its worker processes (a graph compiled anew) are inside inductor's seconds, not counted."""

    graphs_from_cache: int = 0
    graphs_compiled: int = 0
    trace_s: float = 0.0
    inductor_s: float = 0.0
    kernels_from_cache: int = 0
    kernels_compiled: int = 0
    kernel_compile_s: float = 0.0
    compiled_names: list[str] = field(default_factory=list)
    """The kernels compiled anew, each name once, in the order first compiled."""

    def counts(self) -> dict[str, int | list[str]]:
        """As bench rows and generate's --json record it per compiled variant."""
        return {"from_cache": self.graphs_from_cache, "compiled": self.graphs_compiled,
                "trace_ms": round(self.trace_s * 1e3), "inductor_ms": round(self.inductor_s * 1e3),
                "kernels_from_cache": self.kernels_from_cache, "kernels_compiled": self.kernels_compiled,
                "kernel_compile_ms": round(self.kernel_compile_s * 1e3), "kernels_compiled_names": self.compiled_names}


def _plural(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def reason(counts: Mapping[str, Any]) -> str:
    """`CacheUse.counts` in words: `1 graph from the compile cache (traced in 2.1 s, inductor 0.9 s);
    14 Triton kernels compiled in 9.8 s, 30 from Triton's cache` ("" when nothing was built or loaded)."""
    graphs = ", ".join(f"{_plural(n, 'graph')} {what}" for n, what in
                       ((counts.get("compiled", 0), "compiled"), (counts.get("from_cache", 0), "from the compile cache"))
                       if n)
    seconds = [f"{label} {counts[key] / 1e3:.1f} s" for key, label in (("trace_ms", "traced in"),
                                                                         ("inductor_ms", "inductor"))
               if counts.get(key, 0) >= 50]  # what rounds to 0.0 s is not said
    if graphs and seconds:
        graphs += f" ({', '.join(seconds)})"
    made, found = counts.get("kernels_compiled", 0), counts.get("kernels_from_cache", 0)
    kernels = ([f"{_plural(made, 'Triton kernel')} compiled in {counts.get('kernel_compile_ms', 0) / 1e3:.1f} s"]
               if made else [])
    if found:
        kernels.append(f"{found} from Triton's cache" if made else f"{_plural(found, 'Triton kernel')} from Triton's cache")
    return "; ".join(part for part in (graphs, ", ".join(kernels)) if part)


def graph_cache_counts() -> tuple[int, int]:
    """(hits, misses) of inductor's FX graph cache in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"].get("fxgraph_cache_hit", 0)), int(counters["inductor"].get("fxgraph_cache_miss", 0))


_PHASES = {"trace": "bytecode_tracing", "inductor": "OutputGraph.call_user_compiler"}
"""The phases of dynamo's compile timers (torch._dynamo.utils.compilation_time_metrics) CacheUse
reports: tracing the Python code, and the backend (inductor compiling the graph or loading it from
its cache). A torch that names them otherwise reports 0."""


def _phase_seconds() -> dict[str, float]:
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return dict.fromkeys(_PHASES, 0.0)
    return {name: float(sum(compilation_time_metrics.get(key, ()))) for name, key in _PHASES.items()}


def _triton_knobs():
    """Triton's compilation knobs where this Triton has a compile listener (3.4+), else None."""
    try:
        from triton import knobs
    except ImportError:
        return None
    return knobs.compilation if hasattr(getattr(knobs, "compilation", None), "listener") else None


@contextlib.contextmanager
def cache_use() -> Iterator[CacheUse]:
    """Count what the block loads and builds (the kernels as it runs; the graphs and phases when it
    ends). Any compile listener already installed still hears every compile."""
    use, lock, knobs = CacheUse(), threading.Lock(), _triton_knobs()
    before, phases = graph_cache_counts(), _phase_seconds()
    previous = knobs.listener if knobs is not None else None

    def listener(*, src, metadata, metadata_group, times, cache_hit) -> None:
        with lock:
            if cache_hit:
                use.kernels_from_cache += 1
            else:
                use.kernels_compiled += 1
                use.kernel_compile_s += times.total / 1e6
                name = str(metadata.get("name") or getattr(getattr(src, "fn", None), "__name__", "?"))
                if name not in use.compiled_names:
                    use.compiled_names.append(name)
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

    if knobs is not None:
        knobs.listener = listener
    try:
        yield use
    finally:
        if knobs is not None:
            knobs.listener = previous
        after, now = graph_cache_counts(), _phase_seconds()
        use.graphs_from_cache, use.graphs_compiled = after[0] - before[0], after[1] - before[1]
        use.trace_s, use.inductor_s = now["trace"] - phases["trace"], now["inductor"] - phases["inductor"]


def artifacts_supported() -> bool:
    import torch

    return hasattr(torch.compiler, "save_cache_artifacts") and hasattr(torch.compiler, "load_cache_artifacts")


def _count(info) -> int:
    """Number of artifacts a torch CacheInfo lists (its fields are lists per cache kind)."""
    total = 0
    for value in vars(info).values() if info is not None else ():
        if isinstance(value, (list, tuple, dict)):
            total += len(value)
    return total


def artifacts_blob() -> tuple[bytes, int] | None:
    """(serialized artifacts, how many) of what this process compiled, or None (nothing, or a
    torch without mega-cache)."""
    if not artifacts_supported():
        return None
    import torch

    saved = torch.compiler.save_cache_artifacts()
    if not saved or not saved[0]:
        return None
    return saved[0], _count(saved[1])


def _check_key(key: object) -> None:
    text = str(key)
    parts = Path(text).parts
    if not text or "\0" in text or os.path.isabs(text) or ".." in parts or "\\" in text:
        raise UnsafeArtifactError(f"artifact key {text[:80]!r} would write outside the cache dir")


def load_blob(blob: bytes) -> int:
    """Load serialized artifacts (this process's own, or a verified file's) into the current
    caches; returns how many. Every artifact's key is checked before any is written."""
    from torch.compiler._cache import CacheArtifactManager

    artifacts = CacheArtifactManager.deserialize(blob)
    if artifacts is None:
        raise ValueError("torch could not read the artifacts (another torch version?)")
    for artifact in (a for group in artifacts.values() for a in group):
        _check_key(artifact.key)
    return _count(CacheArtifactManager.populate_caches(artifacts))


@contextlib.contextmanager
def fresh_artifacts() -> Iterator[None]:
    """Record only the artifacts compiled inside the block (a bench row's own), where torch can."""
    manager = None
    with contextlib.suppress(ImportError, AttributeError):
        from torch.compiler._cache import CacheArtifactManager as manager  # noqa: N813
    if manager is None or not hasattr(manager, "with_fresh_cache"):
        yield
        return
    with manager.with_fresh_cache():
        yield


def save_artifacts(path: Path) -> int | None:
    """Write this process's compile artifacts to `path` (atomically); returns how many, or None
    when torch cannot (too old) or there was nothing to save."""
    saved = artifacts_blob()
    if saved is None:
        return None
    signed = sign(saved[0], purpose=_PURPOSE)
    if signed is None:
        log.warning("compile cache not saved: %s", key_problem() or f"no kiln key could be created in {config_dir()}")
        return None
    write_atomic(path, signed)
    return saved[1]


def load_artifacts(path: Path) -> int | None:
    """Load artifacts saved by `save_artifacts` into the current caches; returns how many (None if
    there is no file or torch cannot). A file kiln did not sign under this user's key, or one
    torch cannot read, is skipped with a warning: the compile then runs cold, which is slower but
    correct, and nothing in the file has been unpickled."""
    if not path.is_file() or not artifacts_supported():
        return None
    try:
        blob = verify(path.read_bytes(), purpose=_PURPOSE)
    except (OSError, UntrustedFileError) as exc:
        log.warning("compile cache %s not loaded: %s; compiling from scratch", path, exc)
        return None
    try:
        return load_blob(blob)
    except Exception as exc:  # another torch version's blob, truncated file: compile cold instead
        log.warning("compile cache %s not loaded (%s: %s); compiling from scratch", path, type(exc).__name__, exc)
        return None


class RunCompileCache:
    """A run's `compile_cache.bin`: loaded before a resumed run compiles, saved once (rank 0) with
    the first checkpoint after compiling. Never fails the run: a cache is an optimisation."""

    def __init__(self, run_dir: Path, cfg, *, is_main: bool) -> None:
        self.path = Path(run_dir) / ARTIFACTS_FILE
        self.enabled = cfg.enabled and cfg.save_cache
        self.is_main = is_main
        # A file already there is kept only once it loads (signed by this user's kiln); one that
        # does not (another machine's, an older kiln's) is replaced by this run's own.
        self.saved = not self.enabled or not is_main

    def load(self) -> None:
        if self.enabled:
            loaded = load_artifacts(self.path)
            if loaded:
                self.saved = True
                log.info("loaded %d compile cache artifacts from %s", loaded, self.path)

    def save(self) -> None:
        if self.saved:
            return
        self.saved = True
        try:
            count = save_artifacts(self.path)
        except Exception as exc:  # a full disk or a torch quirk must not end a healthy run
            log.warning("compile cache not saved (%s: %s)", type(exc).__name__, exc)
            return
        if count:
            log.info("saved %d compile cache artifacts to %s", count, self.path)
