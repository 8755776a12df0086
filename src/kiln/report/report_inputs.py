"""What `kiln report` reads: a run dir (metrics.jsonl, summary.json, maybe profile_summary.json)
or a bench results dir (results.json following the results contract, docs/architecture.md#results)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.errors import ConfigError
from kiln.monitor.records import BrokenRecordsError, read_records
from kiln.safe_io import MiB, read_json


@dataclass
class RunData:
    path: Path
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    profile: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    """The run's config.toml (what a run killed before its summary.json is reported from)."""


@dataclass
class BenchData:
    path: Path
    env: dict[str, Any]
    config: dict[str, Any]
    command: str | None
    rows: list[dict[str, Any]]
    figures: list[Path] = field(default_factory=list)  # PNGs the bench wrote next to results.json


def _json(path: Path) -> Any:
    try:
        return read_json(path, 64 * MiB)
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError("RUN_DIR", f"{path} is not readable JSON ({exc})") from None


def _toml(path: Path) -> dict[str, Any] | None:
    """A run's config.toml, or None when it is missing or unreadable (the report says less then)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _records(path: Path) -> list[dict[str, Any]]:
    try:
        return read_records(path)  # a torn last line (a killed writer) is dropped, with a warning
    except (OSError, BrokenRecordsError) as exc:
        raise ConfigError("RUN_DIR", str(exc)) from None


def load(path: str | Path) -> RunData | BenchData:
    path = Path(path)
    if not path.exists():
        raise ConfigError("RUN_DIR", f"{path} does not exist")
    if path.is_file():  # results.json / metrics.jsonl / summary.json given directly: report its dir
        path = path.parent
    if (path / "results.json").exists():
        data = _json(path / "results.json")
        if not isinstance(data, dict) or not isinstance(data.get("results"), list):
            raise ConfigError("BENCH_DIR", f"{path / 'results.json'} has no `results` list (docs/architecture.md#results)")
        rows = [r for r in data["results"] if isinstance(r, dict)]
        figures = sorted(p for p in path.glob("*.png"))
        return BenchData(path, data.get("env") or {}, data.get("config") or {}, data.get("command"), rows, figures)
    metrics, summary = path / "metrics.jsonl", path / "summary.json"
    if metrics.exists() or summary.exists():
        records = _records(metrics) if metrics.exists() else []
        profile = path / "profile_summary.json"
        return RunData(path, records, _json(summary) if summary.exists() else {},
                       _json(profile) if profile.exists() else None, _toml(path / "config.toml"))
    raise ConfigError("RUN_DIR", f"{path} holds neither a run (metrics.jsonl, summary.json) nor bench results "
                      "(results.json)")
