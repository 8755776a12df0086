"""Reading DCP checkpoints without executing pickled code, and the helpers every load path shares.

A torch.distributed.checkpoint (DCP) directory holds tensor files (`*.distcp`, read by DCP with
`torch.load(weights_only=True)`), a `.metadata` file written with plain `pickle`, and non-tensor
values (ints, dicts, optimizer hyper-parameters) stored as `torch.save` blobs that DCP's
`DefaultLoadPlanner.load_bytes` reads with `torch.load(weights_only=False)` (torch 2.6 .. 2.13,
default_planner.py). Both of the latter would run arbitrary code from a crafted checkpoint, so kiln
reads checkpoints only through:

- `SafeFileSystemReader`: `.metadata` through an unpickler that resolves only the classes DCP's
  metadata consists of (an allow-list; anything else is refused);
- `SafeLoadPlanner`: non-tensor values through `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import math
import pickle
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import torch

from kiln.safe_io import open_read, regular_file_problem

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

APP_KEY = "app"
"""The one top-level key of every kiln checkpoint: `dcp.save({"app": AppState})`, so tensor keys read
`app.model.<fqn>`, `app.optim.state.<fqn>.exp_avg`, ..."""

METADATA_LIMIT = 1 << 30
"""The largest `.metadata` kiln reads (a model of billions of parameters needs megabytes)."""
_METADATA_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_PATH_CLASSES = {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"}


class UnsafeCheckpointError(pickle.UnpicklingError):
    """The checkpoint metadata names a Python object outside the allow-list."""


class CheckpointReadError(RuntimeError):
    """Reading a checkpoint's data failed (DCP's CheckpointException, which derives from
    BaseException, or an OSError), in kiln's words: which checkpoint, and the first cause."""


def _first_cause(exc: BaseException) -> str:
    """The deciding error inside DCP's wrapper, whose text is every rank's traceback."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        for error in failures.values():
            inner = error[0] if isinstance(error, tuple) else error
            if isinstance(inner, BaseException):
                return f"{type(inner).__name__}: {str(inner).strip().splitlines()[0][:300] if str(inner).strip() else ''}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only what DCP metadata is made of: its dataclasses, torch.Size, dtypes/layouts,
    paths (StorageMeta.checkpoint_id). Everything else (os.system, builtins.eval, ...) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = False
        if module in _METADATA_MODULES:
            allowed = isinstance(getattr(__import__(module, fromlist=[name]), name, None), type)
        elif module == "torch":
            obj = getattr(torch, name, None)
            allowed = obj is torch.Size or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format))
        elif module == "torch.serialization" and name == "_get_layout":  # how torch pickles layouts
            allowed = True
        elif module == "pathlib" and name in _PATH_CLASSES:
            allowed = True
        elif module == "collections" and name == "OrderedDict":
            allowed = True
        if not allowed:
            raise UnsafeCheckpointError(f"checkpoint metadata refers to {module}.{name}, which kiln does not load")
        return super().find_class(module, name)


@functools.cache
def _safe_io_classes() -> tuple[type, type]:
    """`(SafeFileSystemReader, SafeLoadPlanner)`, made on first use: importing
    torch.distributed.checkpoint (and DTensor and sympy with it) is a large part of the start-up
    of a process that only launches ranks, parses a config or reads a run dir, so modules that
    merely may read a checkpoint import it when one is read."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    class SafeFileSystemReader(dcp.FileSystemReader):
        """FileSystemReader whose `.metadata` is read by the allow-list unpickler.

        The signature takes no `rank` on purpose: torch >= 2.8 then never falls back to per-rank
        metadata files (which kiln never writes)."""

        def read_metadata(self) -> Metadata:  # type: ignore[override]
            with open_read(Path(self.path) / ".metadata", METADATA_LIMIT) as f:  # a regular file, bounded
                metadata = _MetadataUnpickler(f).load()
            if not isinstance(metadata, Metadata):
                raise UnsafeCheckpointError(f"{self.path}/.metadata does not hold DCP metadata")
            # What FileSystemReader.read_metadata does after unpickling (torch 2.6 .. 2.13).
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = getattr(self, "load_id", None)
            return metadata

    class SafeLoadPlanner(DefaultLoadPlanner):
        """DefaultLoadPlanner that reads non-tensor values with `torch.load(weights_only=True)`.

        Same body as DefaultLoadPlanner.load_bytes (torch 2.6 .. 2.13) except for `weights_only`."""

        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            obj = torch.load(value, weights_only=True)
            fqn = read_item.dest_index.fqn
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._traverse import set_element

                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj

    return SafeFileSystemReader, SafeLoadPlanner


@contextlib.contextmanager
def quiet_single_process() -> Iterator[None]:
    """DCP warns on every call without a process group that it assumes a single process: that is
    kiln's ordinary one-process run, not news."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to")
        yield


THREAD_BYTES = 256 << 20
"""A rank writes with one thread (and file) per this many bytes of its tensors, up to
`checkpoint.writer_threads`: a small state stays one file per rank."""


def writer_threads(threads: int, tensor_bytes: int) -> int:
    """Writer threads for a rank's share of `tensor_bytes`: one per THREAD_BYTES (at least one),
    at most `threads`."""
    return max(1, min(threads, -(-tensor_bytes // THREAD_BYTES)))


def _item_bytes(item: Any) -> int:
    """Bytes of a DCP WriteItem's tensor (0 for a non-tensor value, which is small)."""
    data = getattr(item, "tensor_data", None)
    if data is None:
        return 0
    return math.prod(data.size) * data.properties.dtype.itemsize


def file_writer(path: Path, threads: int):
    """DCP's FileSystemWriter into `path` with up to `threads` writer threads per rank (one file
    each; `writer_threads` sizes them by the rank's bytes), which fails the save when one of its
    extra threads fails: DCP's own lets such a thread die (its traceback on stderr) and completes
    the checkpoint without that thread's items."""
    _take_writer_thread_errors()
    return _checked_writer()(path, thread_count=threads)


_writer_errors: list[BaseException] = []  # exceptions of DCP's extra writer threads, oldest first
_writer_errors_lock = threading.Lock()


@functools.cache
def _checked_writer() -> type:
    from torch.distributed.checkpoint import FileSystemWriter

    class CheckedFileSystemWriter(FileSystemWriter):
        def __init__(self, path, *, thread_count: int) -> None:
            super().__init__(path, thread_count=thread_count)
            self.max_threads = thread_count  # write_data sizes thread_count by the plan's bytes, up to this

        def write_data(self, plan, planner):  # returns once every thread has written (and joined)
            self.thread_count = writer_threads(self.max_threads, sum(_item_bytes(i) for i in plan.items))
            with _writer_errors_lock:
                seen = len(_writer_errors)
            future = super().write_data(plan, planner)
            with _writer_errors_lock:
                failed = _writer_errors[seen:]
                del _writer_errors[seen:]
            if failed:
                raise failed[0]  # an OSError keeps its errno: disk full reads as disk full
            written = future.value() if future.done() else None  # a torch.futures.Future
            if written is not None and len(written) < len(plan.items):
                raise RuntimeError(f"DCP wrote {len(written)} of this rank's {len(plan.items)} items")
            return future

    return CheckedFileSystemWriter


@functools.cache
def _take_writer_thread_errors() -> None:
    """Route exceptions of DCP's writer threads (running `_write_files_from_queue`) to the save
    that started them instead of printing them; every other thread's go to the previous hook."""
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        tb = args.exc_traceback
        while tb is not None and tb.tb_frame.f_code.co_name != "_write_files_from_queue":
            tb = tb.tb_next
        if tb is None or args.exc_value is None:
            previous(args)
            return
        with _writer_errors_lock:
            _writer_errors.append(args.exc_value)

    threading.excepthook = hook


def read_metadata(path: Path) -> Metadata:
    reader, _ = _safe_io_classes()
    return reader(path).read_metadata()


def dcp_load(state_dict: dict[str, Any], path: Path, *, process_group=None, no_dist: bool = False) -> None:
    """`dcp.load` through the safe reader and planner. `no_dist=True` reads in this process alone
    even when a process group exists (export); torch versions without the flag infer it."""
    import torch.distributed.checkpoint as dcp

    reader, planner = _safe_io_classes()
    kwargs: dict[str, Any] = {"storage_reader": reader(path), "planner": planner()}
    if process_group is not None:
        kwargs["process_group"] = process_group
    if no_dist and "no_dist" in inspect.signature(dcp.load).parameters:
        kwargs["no_dist"] = True
    try:
        with quiet_single_process():
            dcp.load(state_dict, **kwargs)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # CheckpointException is a BaseException: `except Exception` misses it
        raise CheckpointReadError(f"reading checkpoint {path} failed: {_first_cause(exc)}") from exc


def inside(rel: object) -> bool:
    """`rel` is a plain relative name under its directory (no absolute path, no `..`)."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        return False
    parts = PurePosixPath(rel).parts
    return not PurePosixPath(rel).is_absolute() and ".." not in parts and "\\" not in rel


def check_files(path: Path, metadata: Metadata) -> str | None:
    """Why the data files of a checkpoint cannot be complete (missing/truncated), or None.
    A stat per file: catches a checkpoint whose files were cut short without reading them."""
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        if rel is None:
            continue
        end = int(getattr(info, "offset", 0)) + int(getattr(info, "length", 0))
        needed[rel] = max(needed.get(rel, 0), end)
    for rel, end in sorted(needed.items()):
        file = path / rel
        if not inside(rel):
            return f"metadata names a data file outside the checkpoint ({rel!r})"
        if not file.exists() and not file.is_symlink():
            return f"data file {rel} is missing"
        problem = regular_file_problem(file)
        if problem is not None:
            return f"data file {rel} {problem}"
        if file.stat().st_size < end:
            return f"data file {rel} is truncated ({file.stat().st_size} < {end} bytes)"
    return None


def tensor_shapes(metadata: Metadata, prefix: str) -> dict[str, tuple[int, ...]]:
    """`{key without prefix: global shape}` of the tensors whose key starts with `prefix`."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    out = {}
    for key, md in metadata.state_dict_metadata.items():
        if key.startswith(prefix) and isinstance(md, TensorStorageMetadata):
            out[key[len(prefix):]] = tuple(md.size)
    return out


def flat_keys(tree: Any, path: str = "") -> dict[str, Any]:
    """DCP's flattened keys of a nested state dict (torch.distributed.checkpoint._traverse rules:
    mappings are walked; lists only when they hold tensors or mappings; tuples are leaves)."""
    out: dict[str, Any] = {}
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            out.update(flat_keys(v, f"{path}.{k}" if path else str(k)))
    elif isinstance(tree, list) and not _is_leaf_list(tree):
        for i, v in enumerate(tree):
            out.update(flat_keys(v, f"{path}.{i}"))
    else:
        out[path] = tree
    return out


def _is_leaf_list(values: list) -> bool:
    for v in values:
        if isinstance(v, (Mapping, torch.Tensor)) or (isinstance(v, list) and not _is_leaf_list(v)):
            return False
    return True


_DROP = object()


def prune_to(tree: Any, present: set[str], path: str) -> Any:
    """`tree` without the dict entries whose flattened keys the checkpoint lacks, so DCP's strict
    planner loads what is there and the rest keeps its current value. A list with a missing
    element is dropped whole (DCP addresses list elements by index)."""
    if isinstance(tree, Mapping):
        out = {}
        for k, v in tree.items():
            kept = prune_to(v, present, f"{path}.{k}")
            if kept is not _DROP:
                out[k] = kept
        # A dict none of whose entries the checkpoint has (the state of a rank that did not exist
        # when it was saved) is dropped whole: an empty shell would read as "restored, empty".
        return _DROP if tree and not out else out
    if isinstance(tree, list) and not _is_leaf_list(tree):
        items = [prune_to(v, present, f"{path}.{i}") for i, v in enumerate(tree)]
        return _DROP if any(v is _DROP for v in items) else items
    return tree if path in present else _DROP


def is_dropped(value: Any) -> bool:
    return value is _DROP


def preview(keys: Iterable[str], n: int = 5) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:n])
    return shown + (f" (+{len(keys) - n} more)" if len(keys) > n else "")
