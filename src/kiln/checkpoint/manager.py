"""Where checkpoints live, when they count as complete, which one a run resumes from.

    run_dir/checkpoints/step_00000100/        complete: renamed AND holds kiln_complete.json
    run_dir/checkpoints/step_00000200.tmp/    being written (or a crash cut it short): never used

A save writes into `step_N.tmp/` with DCP, then rank 0 writes the completion marker and renames
the directory. Rename is atomic on POSIX filesystems, so a reader sees either no `step_N/` or a
complete one; a crash at any point leaves the previous complete checkpoint as the newest.

A save that fails (full disk, lost permission, a dead peer) raises `CheckpointSaveError` on every
rank after rank 0 removed its `.tmp` directory, so the space it held is free again and nothing
half-written is left; the previous complete checkpoint is never touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import re
import shutil
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from kiln.checkpoint.dcp_io import (
    APP_KEY,
    check_files,
    dcp_load,
    flat_keys,
    is_dropped,
    preview,
    prune_to,
    quiet_single_process,
    read_metadata,
    tensor_shapes,
)
from kiln.checkpoint.state import AppState
from kiln.checkpoint.storage import CheckpointSaveError, discard_partial, remove_partial
from kiln.config.errors import ConfigError
from kiln.config.schema import CheckpointConfig

log = logging.getLogger("kiln.checkpoint")

MARKER = "kiln_complete.json"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d{8,})$")


def read_marker(path: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def checkpoint_problem(path: Path) -> str | None:
    """Why `path` is not a complete kiln checkpoint, or None when it is."""
    if not path.is_dir():
        return "not a directory"
    if path.name.endswith(".tmp"):
        return "its save did not finish (.tmp)"
    marker = read_marker(path)
    if marker is None:
        return f"no valid completion marker ({MARKER})"
    match = _STEP_DIR.match(path.name)
    if match and marker.get("step") != int(match.group(1)):
        return f"marker says step {marker.get('step')}, directory says {int(match.group(1))}"
    try:
        metadata = read_metadata(path)
    except Exception as exc:  # unreadable, truncated or refused metadata: not usable
        return f"unreadable DCP metadata ({type(exc).__name__}: {exc})"
    return check_files(path, metadata)


def latest_complete(root: Path, *, ignore: Path | None = None) -> Path | None:
    """Newest complete checkpoint under `root` (a `checkpoints/` dir); warns naming each newer
    incomplete or corrupt one it skips, and every leftover `.tmp` (other than `ignore`)."""
    if not root.is_dir():
        return None
    for tmp in sorted(root.glob("step_*.tmp")):
        if ignore is None or tmp != ignore:
            log.warning("skipping incomplete checkpoint %s: its save did not finish", tmp)
    candidates = sorted(
        ((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))), reverse=True
    )
    for _, path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        log.warning("skipping checkpoint %s: %s", path, problem)
    return None


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints (renamed and marked), oldest first. Only the marker is checked: this
    decides retention, where reading every checkpoint's metadata would be wasted work."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found) if read_marker(p) is not None]


@dataclasses.dataclass
class LoadReport:
    path: Path
    step: int
    saved_world_size: int
    notes: list[str]


class Checkpointer:
    """Saves, finds and loads checkpoints of one run. Call every method on every rank."""

    def __init__(
        self,
        run_dir: Path,
        cfg: CheckpointConfig,
        *,
        rank: int,
        world_size: int,
        process_group=None,
        config_digest: str | None = None,
    ) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.cfg = cfg
        self.rank, self.world_size = rank, world_size
        self.group = process_group
        self.digest = config_digest
        self.distributed = dist.is_available() and dist.is_initialized()
        self.last_saved_step: int | None = None
        self._pending: tuple[int, Future, Path] | None = None
        self._finalize_error: BaseException | None = None
        self._finalized = threading.Event()
        self._async_group = None
        self.removed_partial: list[Path] = []  # rank 0: .tmp directories of failed saves it removed
        self._async_storage: OSError | None = None  # rank 0: the storage's problem after a failed async save
        if cfg.async_save and self.distributed:
            # async_save runs DCP's collectives in a background thread: they need a CPU (gloo)
            # backend (dcp.async_save asserts it) and must not interleave with the training
            # collectives on the same communicator, hence a group of their own (torchtitan does
            # the same). new_group is collective: every rank constructs its Checkpointer.
            self._async_group = dist.new_group(backend="gloo")

    # -- finding ---------------------------------------------------------------------------
    def latest_complete(self) -> Path | None:
        return latest_complete(self.root, ignore=self._pending[2] if self._pending else None)

    def resolve_resume(self, spec: str) -> Path | None:
        """`never` -> None; `auto` -> newest complete checkpoint or None; else a complete checkpoint dir."""
        if spec == "never":
            return None
        if spec == "auto":
            found = self.latest_complete()
            if found is None:
                log.info("checkpoint.resume=auto: no complete checkpoint in %s, starting fresh", self.root)
            return found
        path = Path(spec).expanduser()
        if not path.exists():
            raise ConfigError("checkpoint.resume", f"{path}: does not exist", ("never", "auto", "PATH"))
        if (path / "checkpoints").is_dir() and not (path / MARKER).exists():
            newest = latest_complete(path / "checkpoints")
            hint = f"newest complete: {newest}" if newest else "it has no complete checkpoint"
            raise ConfigError("checkpoint.resume", f"{path}: is a run directory; give one of its checkpoints ({hint})")
        problem = checkpoint_problem(path)
        if problem is not None:
            raise ConfigError("checkpoint.resume", f"{path}: not a complete kiln checkpoint: {problem}")
        return path

    # -- saving ----------------------------------------------------------------------------
    def save(self, step: int, app_state: AppState, *, final: bool = False, block: bool | None = None) -> Path:
        """Checkpoint `app_state` as `step_{step}`; returns the final directory.

        `block=None` follows `cfg.async_save` (final saves always block). Non-blocking: returns once
        the state is staged in host memory; the checkpoint turns complete in the background and
        at most one save is in flight (this call first waits for the previous one)."""
        self.wait()
        if app_state.guard is not None:
            app_state.guard.check()  # never write a non-finite state (raises NonFiniteError)
        target = self.root / f"step_{step:08d}"
        if self.last_saved_step == step:
            return target  # e.g. the interval save fell on the last step, then the final save
        tmp = target.with_name(target.name + ".tmp")
        block = final or not self.cfg.async_save if block is None else block
        try:
            self._save(step, app_state, tmp, target, final=final, block=block)
        except BaseException as exc:
            # DCP raises only after every rank's writes ended (its results are gathered on rank 0
            # and broadcast), so rank 0 can remove the partial directory without racing a writer.
            interrupted = isinstance(exc, (KeyboardInterrupt, SystemExit))
            storage = self._discard(tmp, None if interrupted else exc) if self.rank == 0 else None
            if interrupted:
                raise
            raise CheckpointSaveError(step, target, exc, storage=storage, rank=self.rank) from exc
        self.last_saved_step = step
        return target

    def _save(self, step: int, app_state: AppState, tmp: Path, target: Path, *, final: bool, block: bool) -> None:
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():  # left by a crashed save of this step
                shutil.rmtree(tmp)
        self._barrier()
        tmp.mkdir(parents=True, exist_ok=True)
        meta = {"step": step, "world_size": self.world_size, "final": final, "format": FORMAT_VERSION,
                "torch": torch.__version__, "config_digest": self.digest}
        started = time.perf_counter()
        state = {APP_KEY: app_state}
        if block:
            with quiet_single_process():
                dcp.save(state, checkpoint_id=tmp, process_group=self.group)
            error = self._finalize(tmp, target, meta, started) if self.rank == 0 else None
            self._raise_if_any(error, step)
            return
        with quiet_single_process():
            response = dcp.async_save(state, checkpoint_id=tmp, process_group=self._async_group)
        # torch >= 2.9 may return AsyncSaveResponse (staging + upload futures); older a Future.
        future: Future = getattr(response, "upload_completion", response)
        self._pending = (step, future, tmp)
        self._finalized.clear()
        self._finalize_error = None
        if self.rank == 0:
            # Rank 0's DCP save returns after every rank's data is written and it has written
            # .metadata, so it can complete the checkpoint in the background, no barrier needed.
            future.add_done_callback(lambda f: self._finalize_async(f, tmp, target, meta, started))
        else:
            future.add_done_callback(lambda f: self._finalized.set())

    def _discard(self, tmp: Path, error: BaseException | None) -> OSError | None:
        storage, removed = discard_partial(self.root, tmp, error)
        self.removed_partial += removed
        return storage

    def remove_partial(self) -> list[Path]:
        """Rank 0, on the failure path once no save is in flight: remove every `step_*.tmp` left
        under the checkpoint root (a save cut short, an interrupted replace). They are never
        resumed from and hold space. Returns what it removed."""
        if self.rank != 0 or self._pending is not None:
            return []
        removed = remove_partial(self.root)
        self.removed_partial += removed
        return removed

    def in_flight(self) -> bool:
        """True while an async save is still being written (this rank's view; never blocks)."""
        return self._pending is not None and not self._finalized.is_set()

    def wait(self, *, collective: bool = True) -> None:
        """Block until the in-flight async save (if any) is complete; raises its error on every rank.
        `collective=False` (the failure path, where peers may be gone) raises this rank's own view
        only, without the broadcast that shares rank 0's finalisation error."""
        if self._pending is None:
            return
        step, future, tmp = self._pending
        self._pending = None
        error: BaseException | None = None
        try:
            future.result()
        except BaseException as exc:  # DCP raises the same CheckpointException on every rank
            error = exc
        self._finalized.wait()
        if self.rank == 0 and error is None:
            error = self._finalize_error
        target = tmp.with_name(tmp.name[: -len(".tmp")])
        try:
            if collective:
                self._raise_if_any(error, step)
            elif error is not None:
                raise error
        except BaseException as exc:
            raise CheckpointSaveError(step, target, exc, storage=self._async_storage, rank=self.rank) from exc

    def close(self, *, collective: bool = True) -> None:
        self.wait(collective=collective)

    def _finalize_async(self, future: Future, tmp: Path, target: Path, meta: dict, started: float) -> None:
        self._async_storage = None
        try:
            error = future.exception()
            if error is None:
                self._finalize_error = self._finalize(tmp, target, meta, started)
                error = self._finalize_error
            if error is not None:
                self._async_storage = self._discard(tmp, error)
        finally:
            self._finalized.set()

    def _finalize(self, tmp: Path, target: Path, meta: dict, started: float) -> BaseException | None:
        """Rank 0: marker, rename, retention. Returns the error instead of raising, so the other
        ranks can be told about it."""
        try:
            meta = {**meta, "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "save_s": round(time.perf_counter() - started, 3)}
            _write_json_durably(tmp / MARKER, meta)
            if target.exists():  # an older timeline's checkpoint of this step (resumed from an earlier one)
                old = target.with_name(target.name + ".old.tmp")
                os.replace(target, old)
                shutil.rmtree(old)
            os.replace(tmp, target)
        except Exception as exc:  # the caller removes the partial directory and reports the error
            return exc
        _fsync_dir(self.root)
        log.info("checkpoint %s saved in %.2fs", target, meta["save_s"])
        try:
            self._apply_retention(keep_also=target)
        except OSError as exc:  # the new checkpoint is complete; old ones stay until the next save
            log.warning("could not apply checkpoint.keep after saving %s: %s", target, exc)
        return None

    def _apply_retention(self, keep_also: Path) -> None:
        if self.cfg.keep <= 0:
            return
        complete = complete_checkpoints(self.root)
        for path in complete[: max(0, len(complete) - self.cfg.keep)]:
            if path != keep_also:
                shutil.rmtree(path, ignore_errors=True)
                log.info("removed old checkpoint %s (checkpoint.keep=%d)", path, self.cfg.keep)

    def _barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.group)

    def _raise_if_any(self, error: BaseException | None, step: int | None = None) -> None:
        """Rank 0's finalisation error, shared with every rank (and a barrier when distributed)."""
        if self.distributed:
            box = [repr(error) if error is not None and self.rank == 0 else None]
            dist.broadcast_object_list(box, src=0, group=self.group)
            if error is None and box[0] is not None:
                raise RuntimeError(f"rank 0 could not complete the checkpoint: {box[0]}")
        if error is not None:
            raise error

    # -- loading ---------------------------------------------------------------------------
    def check_model(self, path: Path, model: torch.nn.Module) -> None:
        """Compare the plain (unwrapped) model's keys and shapes with checkpoint `path` before any
        work: a checkpoint of another model is bad input (exit 2) and nothing gets written."""
        path = Path(path)
        problem = checkpoint_problem(path)
        if problem is not None:
            raise ConfigError("checkpoint.resume", f"{path}: not a complete kiln checkpoint: {problem}")
        metadata = read_metadata(path)
        current = {k: tuple(v.shape) for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
        _check_model(path, tensor_shapes(metadata, f"{APP_KEY}.model."), current, set(metadata.state_dict_metadata))

    def load(self, path: Path, app_state: AppState) -> LoadReport:
        """Restore `app_state` from the complete checkpoint `path`.

        The model's keys and shapes (and the optimizer's state keys) are compared with the
        checkpoint's metadata first; on a mismatch a ConfigError names the path and the first keys,
        and nothing has been modified."""
        path = Path(path)
        problem = checkpoint_problem(path)
        if problem is not None:
            raise ConfigError("checkpoint.resume", f"{path}: not a complete kiln checkpoint: {problem}")
        metadata = read_metadata(path)
        marker = read_marker(path) or {}
        saved_world = int(marker.get("world_size", self.world_size))
        present = set(metadata.state_dict_metadata)

        _check_model(path, tensor_shapes(metadata, f"{APP_KEY}.model."), app_state.model_shapes(), present)
        template = app_state.load_template(saved_world)
        template = _prune_template(path, template, present)
        dcp_load({APP_KEY: template}, path, process_group=self.group)
        app_state.load_state_dict(template)
        if self.digest and marker.get("config_digest") not in (None, self.digest):
            app_state.notes.append("the config differs from the one the checkpoint was saved with")
        for note in app_state.notes:
            log.warning("resume from %s: %s", path, note)
        self.last_saved_step = None
        return LoadReport(path=path, step=int(marker.get("step", app_state.progress.get("step", 0))),
                          saved_world_size=saved_world, notes=list(app_state.notes))


def _check_model(path: Path, saved: dict[str, tuple[int, ...]], current: dict[str, tuple[int, ...]],
                 present: set[str]) -> None:
    prefix = f"{APP_KEY}.model."
    saved_keys = set(saved) | {k[len(prefix):] for k in present if k.startswith(prefix)}
    missing = set(current) - saved_keys
    unexpected = saved_keys - set(current)
    shapes = [f"{k} {list(saved[k])} in checkpoint vs {list(current[k])} in model"
              for k in sorted(set(saved) & set(current)) if saved[k] != current[k]]
    if not (missing or unexpected or shapes):
        return
    parts = []
    if missing:
        parts.append(f"missing {preview(missing)}")
    if unexpected:
        parts.append(f"unexpected {preview(unexpected)}")
    if shapes:
        parts.append(f"shape {'; '.join(shapes[:3])}" + (f" (+{len(shapes) - 3} more)" if len(shapes) > 3 else ""))
    raise ConfigError("checkpoint.resume", f"{path}: checkpoint does not match the model: {', '.join(parts)}")


def _prune_template(path: Path, template: dict[str, Any], present: set[str]) -> dict[str, Any]:
    """Keep the entries the checkpoint has. The model was checked exactly; optimizer state of a
    parameter the checkpoint has state for must match key by key (else: another optimizer);
    parameters without any saved state (never got a gradient) and everything else (progress,
    rank-local state of ranks that did not exist, hyper-parameters a newer torch added) keep their
    current values."""
    state_prefix = f"{APP_KEY}.optim.state."
    saved_params = {k[len(state_prefix):] for k in present if k.startswith(state_prefix)}
    wrong = []
    for fqn, param_state in template.get("optim", {}).get("state", {}).items():
        if not any(s.startswith(f"{fqn}.") for s in saved_params):
            continue
        for key in flat_keys(param_state, f"{state_prefix}{fqn}"):
            if key not in present:
                wrong.append(key[len(f"{APP_KEY}.optim."):])
    if wrong:
        raise ConfigError("checkpoint.resume", f"{path}: checkpoint does not match the optimizer: missing "
                          f"{preview(wrong)} (saved with another optimizer?)")
    pruned = {}
    for section, value in template.items():
        if section == "model":
            pruned[section] = value
            continue
        kept = prune_to(value, present, f"{APP_KEY}.{section}")
        if not is_dropped(kept):
            pruned[section] = kept
    return pruned


def _write_json_durably(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    """Make a rename durable (POSIX: the directory entry lives in the parent)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory; the rename stands
            os.fsync(fd)
    finally:
        os.close(fd)
