"""Saving, retention, resume and loading of a run's checkpoints (layout: kiln.checkpoint.layout).

A save writes into `step_N.tmp/` with DCP, then rank 0 writes the completion marker and renames
the directory. Rename is atomic on POSIX filesystems, so a reader sees either no `step_N/` or a
complete one; a crash at any point leaves the previous complete checkpoint as the newest.

A save that fails (full disk, lost permission, a dead peer) raises `CheckpointSaveError` on every
rank after rank 0 removed its `.tmp` directory (its space is free again); the previous complete
checkpoint is never touched. Each save's stall and total time are recorded; async saves stage
through page-locked host buffers on CUDA, kept from one save to the next (save_timing)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import shutil
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import torch
import torch.distributed as dist

from kiln.checkpoint.compat import check_model_keys, prune_template, unused_optimizer_state
from kiln.checkpoint.dcp_io import (
    APP_KEY,
    CheckpointReadError,
    dcp_load,
    file_writer,
    quiet_single_process,
    read_metadata,
    tensor_shapes,
)
from kiln.checkpoint.layout import (
    FORMAT_VERSION,
    MARKER,
    checkpoint_problem,
    checkpoint_step,
    complete_checkpoints,
    content_manifest,
    latest_complete,
    read_marker,
)
from kiln.checkpoint.save_timing import PROGRESS_EVERY_S, PinnedStaging, SaveTimes, save_progress
from kiln.checkpoint.signals import interruption
from kiln.checkpoint.state import AppState
from kiln.checkpoint.storage import CheckpointSaveError, discard_partial, newest_intact, remove_partial
from kiln.checkpoint.timeline import branch_point
from kiln.config.schema import CheckpointConfig
from kiln.errors import ConfigError
from kiln.safe_io import write_json

log = logging.getLogger("kiln.checkpoint")


@dataclasses.dataclass
class LoadReport:
    path: Path
    step: int
    saved_world_size: int
    notes: list[str]
    skipped: list[str] = dataclasses.field(default_factory=list)
    """Newer checkpoints passed over because their data could not be read (`load_readable`)."""


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
        self.last_saved_step: int | None = None
        self._pending: tuple[int, Future, Path, float] | None = None
        self._finalize_error: BaseException | None = None
        self._finalized = threading.Event()
        self._async_group = None
        self.removed_partial: list[Path] = []  # rank 0: .tmp directories of failed saves it removed
        self._async_storage: OSError | None = None  # rank 0: the storage's problem after a failed async save
        self.times = SaveTimes()  # each save's stall on the training step and total time
        self._staging = PinnedStaging()

    @property
    def distributed(self) -> bool:
        """Whether a process group is up now: `kiln train` builds its Checkpointer before its
        ranks join the group, so this is read at each use, never at construction."""
        return dist.is_available() and dist.is_initialized()

    def _async_save_group(self):
        """The group of async saves' collectives, made at the first async save (None without a
        process group). DCP runs them in a background thread: they need a CPU (gloo) backend
        (dcp.async_save refuses NCCL's default group) and must not interleave with the training
        collectives, hence a group of their own (as torchtitan's). new_group is collective."""
        if self._async_group is None and self.distributed:
            self._async_group = dist.new_group(backend="gloo")
        return self._async_group

    # -- finding ---------------------------------------------------------------------------
    def latest_complete(self) -> Path | None:
        return latest_complete(self.root, ignore=self._pending[2] if self._pending else None)

    def resolve_resume(self, spec: str) -> Path | None:
        """`never` -> None; `auto` -> newest complete checkpoint or None; else a complete checkpoint dir."""
        if spec == "never":
            return None
        if spec == "auto":
            found = self.latest_complete()
            if found is None:  # a branched run that crashed before its first save: its branch point
                found = branch_point(self.root)
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
        entered = time.perf_counter()
        self.wait()
        waited = time.perf_counter() - entered
        if app_state.guard is not None:
            app_state.guard.check()  # never write a non-finite state (raises NonFiniteError)
        target = self.root / f"step_{step:08d}"
        if self.last_saved_step == step:
            return target  # e.g. the interval save fell on the last step, then the final save
        tmp = target.with_name(target.name + ".tmp")
        block = final or not self.cfg.async_save if block is None else block
        timing = self.times.begin(step, asynchronous=not block, final=final)
        self.times.waited(timing, waited)
        try:
            self._save(step, app_state, tmp, target, final=final, block=block, timing=timing)
        except BaseException as exc:
            # DCP raises only after every rank's writes ended (its results are gathered on rank 0
            # and broadcast), so rank 0 can remove the partial directory without racing a writer.
            interrupted = interruption(exc)  # a second Ctrl-C / SIGTERM: the user insisted, not a failure
            if interrupted is None and isinstance(exc, SystemExit):
                interrupted = exc
            storage = self._discard(tmp, None if interrupted else exc) if self.rank == 0 else None
            if interrupted is not None:
                # Sizes, not checksums: a second Ctrl-C asks to stop now, not after reading every byte.
                kept = newest_intact(self.root, hashes=False)
                log.warning("interrupted while saving checkpoint step %d: its partial save was removed; %s", step,
                            f"the newest complete checkpoint, {kept}, is intact: the same command continues from it"
                            if kept is not None else f"{self.root} holds no complete checkpoint of this run yet")
                if interrupted is exc:
                    raise
                raise interrupted from None
            raise CheckpointSaveError(step, target, exc, storage=storage, rank=self.rank) from exc
        self.times.stalled(timing, time.perf_counter() - entered)
        self.last_saved_step = step
        return target

    def _save(self, step: int, app_state: AppState, tmp: Path, target: Path, *, final: bool, block: bool,
              timing: dict) -> None:
        import torch.distributed.checkpoint as dcp  # here, not at the top: see AppState

        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.is_symlink() or tmp.is_file():  # not kiln's: only the name goes, never what it names
                tmp.unlink()
            elif tmp.exists():  # left by a crashed save of this step
                shutil.rmtree(tmp)
        self._barrier()
        tmp.mkdir(parents=True, exist_ok=True)
        meta = {"step": step, "world_size": self.world_size, "final": final, "format": FORMAT_VERSION,
                "torch": torch.__version__, "config_digest": self.digest}
        started = time.perf_counter()
        state = {APP_KEY: app_state}
        if block:
            if final and self.rank == 0:
                log.info("writing the final checkpoint step %d into %s", step, tmp)
            with quiet_single_process(), save_progress(tmp, step, enabled=self.rank == 0):
                dcp.save(state, checkpoint_id=tmp, process_group=self.group, storage_writer=file_writer(tmp, self.cfg.writer_threads))
            error = self._finalize(tmp, target, meta, started) if self.rank == 0 else None
            self._raise_if_any(error, step)
            self.times.done(timing, time.perf_counter() - started)
            return
        with quiet_single_process():
            response = dcp.async_save(state, checkpoint_id=tmp, process_group=self._async_save_group(),
                                      storage_writer=file_writer(tmp, self.cfg.writer_threads), **self._staging.kwargs())
        future: Future = getattr(response, "upload_completion", response)  # torch >= 2.9: AsyncSaveResponse
        self._pending = (step, future, tmp, started)
        self._finalized.clear()
        self._finalize_error = None
        if self.rank == 0:
            # Rank 0's DCP save returns after every rank's data is written and it has written
            # .metadata, so it can complete the checkpoint in the background, no barrier needed.
            future.add_done_callback(lambda f: self._finalize_async(f, tmp, target, meta, started, timing))
        else:
            future.add_done_callback(lambda f: self._async_done(f, started, timing))

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
        step, future, tmp, started = self._pending
        self._pending = None
        error: BaseException | None = None
        with save_progress(tmp, step, enabled=self.rank == 0 and not self._finalized.is_set(), since=started):
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

    def prepare_async(self, app_state: AppState) -> float | None:
        """Before a run's first async save (every rank, after its first step): stage the state once
        so the saves' host buffers are allocated and pinned then, not on a save's step. The seconds
        it took (also in summary.json's `checkpoint_saves`), or None when there is nothing to do."""
        if not (self.cfg.async_save and self.cfg.interval):
            return None
        self.times.prepare_s = self._staging.prepare({APP_KEY: app_state.state_dict()})
        return self.times.prepare_s

    def close(self, *, collective: bool = True) -> None:
        try:
            self.wait(collective=collective)
        finally:
            self._staging.close()

    def _async_done(self, future: Future, started: float, timing: dict) -> None:  # ranks but 0
        if future.exception() is None:
            self.times.done(timing, time.perf_counter() - started)
        self._finalized.set()

    def _finalize_async(self, future: Future, tmp: Path, target: Path, meta: dict, started: float,
                        timing: dict) -> None:
        self._async_storage = None
        try:
            error = future.exception()
            if error is None:
                self._finalize_error = self._finalize(tmp, target, meta, started)
                error = self._finalize_error
            if error is not None:
                self._async_storage = self._discard(tmp, error)
            else:
                self.times.done(timing, time.perf_counter() - started)
        finally:
            self._finalized.set()

    def _finalize(self, tmp: Path, target: Path, meta: dict, started: float) -> BaseException | None:
        """Rank 0: marker, rename, retention. Returns the error instead of raising, so the other
        ranks can be told about it."""
        try:
            meta = {**meta, "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "save_s": round(time.perf_counter() - started, 3)}
            if meta["save_s"] > PROGRESS_EVERY_S:  # checksums of a large checkpoint take a while too
                log.info("checkpoint step %d: written in %.0f s; checksumming its files", meta["step"], meta["save_s"])
            meta["files"] = content_manifest(tmp)  # checked before every load (layout.content_problem)
            write_json(tmp / MARKER, meta, durable=True)
            if target.exists():  # an older timeline's checkpoint of this step (resumed from an earlier one)
                old = target.with_name(target.name + ".old.tmp")
                os.replace(target, old)
                shutil.rmtree(old)
            os.replace(tmp, target)
        except Exception as exc:  # the caller removes the partial directory and reports the error
            return exc
        _fsync_dir(self.root)
        log.info("checkpoint %s saved in %.2fs", target, time.perf_counter() - started)  # checksums included
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
        check_model_keys(path, tensor_shapes(metadata, f"{APP_KEY}.model."), current, set(metadata.state_dict_metadata))

    def load_readable(self, path: Path, app_state: AppState, *, fall_back: bool) -> LoadReport:
        """`load(path)`; with `fall_back` (auto resume) a checkpoint whose data cannot be read is
        skipped, with a warning naming it and why, for the newest older one that loads. The report's
        `skipped` lists what was passed over."""
        skipped: list[str] = []
        while True:
            try:
                report = self.load(path, app_state)
                report.skipped = skipped
                return report
            except CheckpointReadError as exc:
                older = latest_complete(self.root, before=checkpoint_step(path)) if fall_back else None
                if older is None:
                    raise
                log.warning("skipping checkpoint %s: %s; resuming from the older %s", path, exc, older)
                skipped.append(f"{path}: {exc}")
                path = older

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

        check_model_keys(path, tensor_shapes(metadata, f"{APP_KEY}.model."), app_state.model_shapes(), present)
        template = app_state.load_template(saved_world)
        unused = unused_optimizer_state(template, present)
        template = prune_template(path, template, present)
        dcp_load({APP_KEY: template}, path, process_group=self.group)
        app_state.config_hyperparameters = bool(self.digest) and marker.get("config_digest") not in (None, self.digest)
        app_state.load_state_dict(template)
        if unused is not None:
            app_state.notes.append(unused)
        for note in app_state.notes:
            log.warning("resume from %s: %s", path, note)
        self.last_saved_step = None
        return LoadReport(path=path, step=int(marker.get("step", app_state.progress.get("step", 0))),
                          saved_world_size=saved_world, notes=list(app_state.notes))


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
