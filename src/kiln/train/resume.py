"""The resume decision: what a run does with the run dir it was given, decided before any work.

`decide_resume` compares the run dir's run with this config (kiln.train.rundir, which reads the
dir once) and asks the checkpoint manager which checkpoint to continue from. Every rank decides
(read-only), so bad input stops all of them before the process group forms.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.checkpoint import Checkpointer, config_digest
from kiln.checkpoint.layout import checkpoint_step
from kiln.config.schema import Config
from kiln.train.rundir import (
    already_complete_summary,
    continue_schedule,
    inspect_run_dir,
    judge_run_dir,
    no_checkpoint_decision,
)

log = logging.getLogger("kiln.train")


@dataclass(frozen=True)
class Resume:
    path: Path | None
    """The checkpoint to continue from; None: a fresh start."""
    branching: bool
    """`checkpoint.resume=PATH`: a new timeline continues from another checkpoint."""
    step: int = 0
    """The step of `path` (read once from its completion marker; -1 without one); 0 for a fresh start."""
    summary: dict[str, Any] | None = None
    """The run dir holds this run, finished (nothing to train): its summary, what it wrote untouched
    (kiln.train.rundir `already_complete_summary`); None otherwise."""

    @property
    def already_complete(self) -> bool:
        return self.summary is not None

    @property
    def first_step(self) -> int:
        """The step this run (segment) begins with, as far as the decision knows."""
        return self.step + 1


def decide_resume(cfg: Config, run_dir: Path, checkpointer: Checkpointer, *, is_main: bool) -> Resume:
    """The checkpoint to resume from (or None), whether the run is already complete, and whether
    this run branches. A run dir with another config's run is refused (ConfigError, exit 2)."""
    resume = cfg.checkpoint.resume
    # An elastic restart continues the group's own run: nothing to compare, and it continues
    # from the newest checkpoint (or the branch point), not from a `checkpoint.resume=PATH` again.
    restarting = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if restarting and resume != "never":
        resume = "auto"
    branching = resume not in ("auto", "never")
    if restarting:
        note, state = "restart", inspect_run_dir(run_dir)
    else:
        note, state = judge_run_dir(run_dir, cfg, resume, locked=True)
    if resume == "auto" and note is None:
        return Resume(None, branching)  # nothing there yet: a fresh start
    if note in ("same config", "longer", "restart"):  # the run's LR schedule continues, never restarts
        said = continue_schedule(state, cfg)
        checkpointer.digest = config_digest(cfg)
        if said and is_main:
            log.info(said)
    path = checkpointer.resolve_resume(resume)
    step = checkpoint_step(path) if path is not None else 0
    if path is not None and resume == "auto" and step >= cfg.training.steps:
        return Resume(path, branching, step, already_complete_summary(state, path, step))
    if note in ("same config", "longer"):
        if path is None:
            log.warning(no_checkpoint_decision(state))
        elif note == "longer":
            log.info("%s holds this run with fewer steps: continuing it from %s", run_dir, path.name)
        else:
            log.info("%s holds an unfinished run of this config: continuing it", run_dir)
    return Resume(path, branching, step)
