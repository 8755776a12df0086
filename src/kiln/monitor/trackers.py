"""Experiment trackers beside TensorBoard: MLflow and Weights & Biases (`metrics.tracker`), the ones
accelerate and Lightning users reach for. Each is a metrics sink: the run's config as parameters
once, every number of each record at its step, and the run's end status when it closes.

Both are optional and imported when chosen; a missing package is bad input (exit 2) before
training. Where they write follows their own settings: MLflow's `MLFLOW_TRACKING_URI` (else the
SQLite store MLflow recommends, RUN_DIR/mlflow.db: `mlflow ui --backend-store-uri sqlite:///...`),
W&B's `WANDB_*` variables (`WANDB_MODE=offline` keeps it local; files under RUN_DIR/wandb).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from kiln.errors import ConfigError
from kiln.monitor.sink import MetricsSink, scalars

Tracker = Literal["none", "mlflow", "wandb"]
TRACKERS: tuple[Tracker, ...] = ("none", "mlflow", "wandb")
HINTS = {"mlflow": "pip install 'kiln[mlflow]' (or mlflow / mlflow-skinny)", "wandb": "pip install 'kiln[wandb]' (or wandb)"}


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as dotted keys with string values (what both trackers take as parameters)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and not prefix:
            out.update(flat_params(value, f"{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)[:500]
    return out


def check_tracker(name: str) -> None:
    """ConfigError (exit 2, before any work) for an unknown tracker or one whose package is missing."""
    if name not in TRACKERS:
        raise ConfigError("metrics.tracker", f"unknown tracker {name!r}", TRACKERS)
    if name == "none":
        return
    import importlib.util

    if importlib.util.find_spec(name) is None:
        raise ConfigError("metrics.tracker", f"{name} is not installed: {HINTS[name]}")


class MlflowSink(MetricsSink):
    """One MLflow run per kiln run (segment): parameters, then metrics at each record's step."""

    def __init__(self, run_dir: Path, project: str, params: Mapping[str, str]):
        import mlflow

        self._mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            mlflow.set_tracking_uri(f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
        mlflow.set_experiment(project)
        self.run = mlflow.start_run(run_name=run_dir.name)
        mlflow.log_params(dict(params))
        self._open = True

    def log(self, record: Mapping[str, Any]) -> None:
        values = dict(scalars(record))
        if values:
            self._mlflow.log_metrics(values, step=int(record.get("step", 0)))

    def close(self, status: str = "FINISHED") -> None:
        if self._open:
            self._open = False
            self._mlflow.end_run(status=status)


class WandbSink(MetricsSink):
    """One W&B run per kiln run (segment): the config, then each record at its step."""

    def __init__(self, run_dir: Path, project: str, params: Mapping[str, str]):
        import wandb

        self.run = wandb.init(project=project, name=run_dir.name, dir=str(run_dir), config=dict(params))

    def log(self, record: Mapping[str, Any]) -> None:
        values = dict(scalars(record))
        if values:
            self.run.log(values, step=int(record.get("step", 0)))

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def build_tracker(name: str, run_dir: Path, project: str, config: Mapping[str, Any]) -> MetricsSink | None:
    """The tracker sink `metrics.tracker` names (None for `none`)."""
    check_tracker(name)
    if name == "none":
        return None
    sink = MlflowSink if name == "mlflow" else WandbSink
    return sink(Path(run_dir), project or "kiln", flat_params(config))
