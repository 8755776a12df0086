"""What `kiln train` does with a run dir that already holds a run.

Rerunning the command of a run that crashed or was killed continues it: `checkpoint.resume`
defaults to `auto`, and a run dir holding a run of the *same* config resumes from its newest
complete checkpoint (as torchtitan does). A run dir holding a run of a *different* config is
protected: bad input (exit 2) naming each differing key with both values, and nothing is touched.

"Same config" compares the keys that decide what a run computes (kiln.config.identity); the
comparison is made with the run dir's `config.toml` (the resolved config the first attempt
wrote), so it works before any checkpoint exists.

Decisions, for `checkpoint.resume=auto` (see `check_run_dir`):
- no run there: a fresh start;
- a run of another config: refused, differing keys named;
- the same config with a complete checkpoint: resume from it (if it is the final step, the
  run is already complete: nothing to do, nothing written);
- the same config, no complete checkpoint, not completed: the attempt died before its first
  save, so the run starts over (with a warning);
- the same config, completed, no checkpoint (`checkpoint.save_final=false`): refused, since
  starting over would overwrite a finished run.
`never` refuses any run dir that holds a run (the message names `checkpoint.resume=auto`); a
checkpoint PATH starts from that checkpoint whatever the run dir holds (the user chose it).
A run dir in use by a live kiln process (an advisory lock) is refused in every mode. The lock is
taken before these checks and held until the run ends; a process that does not hold it writes and
deletes nothing in the dir.
"""

from __future__ import annotations

import contextlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.config.identity import compare, identity, schedule_span
from kiln.config.load import CONFIG_LIMIT
from kiln.errors import ConfigError
from kiln.monitor.summary import read_summary
from kiln.outputs import lock_holder

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib
from kiln.checkpoint.storage import newest_intact
from kiln.monitor.records import keep_through
from kiln.runtime import DEFAULT_RUNS_ROOT, default_run_dir, run_slug
from kiln.safe_io import read_text

# Files whose presence means a directory already holds a run that must not be overwritten.
RUN_MARKERS = ("summary.json", "metrics.jsonl", "checkpoints")

@dataclass
class RunDirState:
    """What a directory holds, read without writing anything."""

    path: Path
    held: list[str]
    """The run markers present (summary.json, metrics.jsonl, checkpoints)."""
    saved_identity: dict[str, Any] | None
    """Identity of the run's config.toml; None when it is missing or unreadable."""
    summary: dict[str, Any] | None
    """summary.json as the run wrote it; None without a readable one."""

    @property
    def holds_run(self) -> bool:
        return bool(self.held)

    @property
    def status(self) -> str | None:
        """summary.json's status; None without a readable summary."""
        return (self.summary or {}).get("status")


def inspect_run_dir(path: Path) -> RunDirState:
    if path.exists() and not path.is_dir():
        raise ConfigError("--run-dir", f"{path} exists and is not a directory")
    held = [m for m in RUN_MARKERS if (path / m).exists()]
    summary = read_summary(path)
    saved = None
    with contextlib.suppress(OSError, ValueError):  # unreadable: treated as absent, and said so
        saved = identity(tomllib.loads(read_text(path / "config.toml", CONFIG_LIMIT)))
    return RunDirState(path, held, saved, summary)


def check_run_dir(path: Path, config: Any = None, resume: str = "never", *, locked: bool = False) -> str | None:
    """Raise ConfigError if training `config` in `path` with `checkpoint.resume=resume` would
    overwrite another run (see the module docstring); return a note for the log, or None.
    Reads only: nothing is written or removed. `locked`: the caller (or its launcher) holds the
    run dir's lock, so the dir cannot be in use by anyone else."""
    return judge_run_dir(Path(path), config, resume, locked=locked)[0]


def judge_run_dir(path: Path, config: Any, resume: str, *, locked: bool) -> tuple[str | None, RunDirState]:
    """`check_run_dir`'s note, and what the dir holds (read once: the resume decision continues the
    saved run's schedule and, for a completed run, returns its summary from it)."""
    state = inspect_run_dir(path)
    pid = lock_holder(path) if path.is_dir() and not locked else None
    if pid is not None:
        raise ConfigError("--run-dir", f"{path} is in use by a running kiln process (pid {pid}); choose another directory")
    if not state.holds_run:
        return None, state
    held = ", ".join(state.held)
    if resume == "never" or config is None:
        raise ConfigError("--run-dir", f"{path} already holds a run ({held}); rerun with checkpoint.resume=auto "
                          "to continue it, or choose a new directory")
    if resume != "auto":
        return None, state  # an explicit checkpoint: the user chose where to start from
    if state.saved_identity is None:
        raise ConfigError("--run-dir", f"{path} holds a run ({held}) but no readable config.toml to compare this "
                          "config with; choose a new directory, or pass checkpoint.resume=<its checkpoint dir>")
    diff, longer = compare(state.saved_identity, config)
    if [d for d in diff if not (longer and d.startswith("training.steps:"))]:
        shown = "; ".join(diff[:6]) + (f"; +{len(diff) - 6} more" if len(diff) > 6 else "")
        raise ConfigError("--run-dir", f"{path} holds a run of another config ({shown}); choose a new directory, "
                          "or pass checkpoint.resume=<one of its checkpoints> to start from it with this config")
    return ("longer" if longer else "same config"), state


def continue_schedule(state: RunDirState, config: Any) -> str | None:
    """Give `config` the span of the run saved in the dir (`state`) when it leaves `optim.decay_steps`
    at 0 (see `continuation_identities`); returns what that means for the LR when the run is trained longer."""
    saved = state.saved_identity or {}
    span = schedule_span(saved)
    if config.optim.decay_steps or not span or span == config.training.steps:
        return None
    config.optim.decay_steps = span
    opt = config.optim
    final = opt.lr if opt.schedule == "constant" else opt.lr * opt.min_lr_ratio
    before = int(saved.get("training.steps") or 0)
    if config.training.steps <= before:
        return None  # a rerun of the run (as trained longer before): nothing new to say
    return (f"training.steps {before} -> {config.training.steps}: training the run longer; its {opt.schedule} LR "
            f"schedule spans steps 1-{span} (optim.decay_steps={span}), so steps {max(span, before) + 1}-{config.training.steps} "
            f"run at its final LR {final:.3g}")


def find_unfinished_run(config: Any, root: Path, slug: str) -> Path | None:
    """The newest default run dir under `root` (`<stamp>-<slug>[-N]`, as kiln.runtime names
    them) holding an unfinished run of this config with a complete checkpoint, and not in use: what
    a rerun of a command without --run-dir continues, as it promised when the run stopped. None when
    there is none (then the rerun starts a new run dir)."""
    if not root.is_dir():
        return None
    pattern = re.compile(rf"(\d{{8}}-\d{{6}})-{re.escape(slug)}(?:-(\d+))?")
    found = [(m.group(1), int(m.group(2) or 1), p) for p in root.iterdir() if (m := pattern.fullmatch(p.name))]
    for _, _, path in sorted(found, reverse=True):
        if not path.is_dir():
            continue
        state = inspect_run_dir(path)
        if state.status == "completed" or state.saved_identity is None or compare(state.saved_identity, config)[0]:
            continue
        if newest_intact(path / "checkpoints", hashes=False) is None or lock_holder(path) is not None:
            continue
        return path
    return None


def choose_run_dir(config: Any, run_dir: str | Path | None) -> tuple[Path, bool]:
    """(run dir, whether it continues an unfinished run found under runs/): --run-dir when given;
    else, with `checkpoint.resume=auto`, the newest unfinished run of this config (so rerunning
    the same command continues it), else a new timestamped dir."""
    if run_dir is not None:
        return Path(run_dir), False
    if config.checkpoint.resume == "auto":
        found = find_unfinished_run(config, Path(DEFAULT_RUNS_ROOT), run_slug(config.model.name))
        if found is not None:
            return found, True
    return default_run_dir(config.model.name), False


def no_checkpoint_decision(state: RunDirState) -> str:
    """With `auto`, the same config and no complete checkpoint: start over, unless the run
    finished (then starting over would overwrite it). Returns the note to log."""
    path = state.path
    if state.status == "completed":
        raise ConfigError("--run-dir", f"{path} holds a completed run of this config and no checkpoint to continue "
                          "from (checkpoint.save_final=false); choose a new directory")
    return (f"{path} holds an earlier attempt of this run that stopped before its first checkpoint; "
            "starting over from step 0")


def already_complete_summary(state: RunDirState, checkpoint: Path, step: int) -> dict[str, Any]:
    """The summary of a run whose newest checkpoint (of `step`) is its last step: what it wrote, untouched."""
    summary: dict[str, Any] = dict(state.summary or {})
    summary.update(already_complete=True, run_dir=str(state.path), checkpoint=str(checkpoint))
    summary.setdefault("steps", step)
    summary.setdefault("status", "completed")
    return summary


def trim_metrics(path: Path, last_step: int) -> None:
    """On resume, drop records past the checkpoint (those steps run again) and a last line a crash
    cut short; rewritten aside and renamed, so a crash here loses nothing."""
    if not path.exists():
        return
    keep_through(path, last_step)
