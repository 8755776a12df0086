"""Opening a run dir (rank 0, under its lock, once the process group formed): the files a run writes
there before its first step.

`open_run_dir` branches the timeline when `checkpoint.resume=PATH` starts from another checkpoint,
writes the resolved `config.toml` and the model files `kiln export` needs (kiln.checkpoint.hf_export
`save_run_files`), and cuts metrics.jsonl back to the checkpoint a resumed run continues from
(removed for a fresh start). It returns the run's earlier segments (kiln.train.segments), read from
the summary.json this segment replaces.
"""

from __future__ import annotations

import logging

from kiln.checkpoint.hf_export import save_run_files
from kiln.checkpoint.timeline import branch
from kiln.train.build_run import RunParts
from kiln.train.features import describe_features
from kiln.train.rundir import trim_metrics
from kiln.train.segments import RunHistory, read_history

log = logging.getLogger("kiln.train")


def open_run_dir(parts: RunParts) -> RunHistory:
    """Rank 0: the run dir with this run's config and model files, its metrics cut back to the
    checkpoint a resumed run continues from (or removed for a fresh start)."""
    cfg, run_dir, resume = parts.cfg, parts.run_dir, parts.resume
    features = describe_features(parts.features) if parts.built.task == "causal_lm" else None
    history = RunHistory()
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume.branching and resume.path is not None:  # one timeline per run dir
        branch(run_dir, resume.path)
    save_run_files(run_dir, cfg, parts.built.hf_config, parts.tokenizer_dir)
    if resume.path is None:  # a fresh start (or a restart with no checkpoint yet)
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    else:  # the earlier segments, from the summary.json this segment will replace; records
        # past the checkpoint run again, so they are cut before the sink opens the file
        history = read_history(run_dir, resume.step)
        trim_metrics(run_dir / "metrics.jsonl", resume.step)
    log.info("strategy: %s (%s)", parts.strategy, parts.strategy_reason)
    if features is not None:
        log.info(features)
    return history
