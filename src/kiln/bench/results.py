"""Result files of every `kiln bench` command and benchmark script: results.json + results.md.

`results.json` is `{"env": {...}, "config": {...}, "results": [row, ...]}` (the results contract, docs/architecture.md#results); each row
has a `status` (ok, oom, error, accuracy_fail, skipped) and its figures.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from kiln.errors import ConfigError
from kiln.outputs import claim_output_dir, release_output_dir
from kiln.safe_io import write_atomic
from kiln.tables import Adaptive

STATUSES = ("ok", "oom", "error", "accuracy_fail", "skipped")

HELD = ("results.json", "results.md", "best.toml", "points", "comm", "decode_profile")
"""What a results directory holds once a command has written to it."""


def refuse_held_results(out: Path, flag: str = "--out") -> None:
    """ConfigError (exit 2, before any work) when `out` already holds results (a new run never
    overwrites an earlier one's files), cannot be written, or is being written by another live
    kiln process. Creates `out` and holds its lock until this process exits (kiln.outputs)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(flag, f"{out} exists and is not a directory")
    def refuse_held() -> None:
        held = [n for n in HELD if (out / n).exists()]
        if held:
            raise ConfigError(flag, f"{out} already holds results ({', '.join(held)}); choose a new directory")

    refuse_held()  # before taking the lock: a refusal leaves the directory as it was
    claim_output_dir(out, flag)
    try:
        refuse_held()  # again under the lock: another command may have finished in between
    except ConfigError:
        release_output_dir(out)
        raise


def format_cell(value: Any) -> str:
    """A table cell: — for missing, yes/no, 4 significant digits."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.4e}"
    return str(value)


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(format_cell(row.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def write_results(out_dir: str | Path, *, env: dict, config: dict, results: list[dict[str, Any]],
                  columns: list[str], title: str, command: str,
                  sections: list[tuple[str, list[dict[str, Any]], list[str]]] | None = None,
                  notes: str = "") -> Path:
    """Write results.json and results.md (table + command line + environment) atomically.
    `sections` (heading, rows, columns) replaces the single table with one table per section;
    `notes` (markdown) follows the tables."""
    for row in results:
        if row.get("status") not in STATUSES:
            raise ValueError(f"row status must be one of {STATUSES}: {row!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"env": env, "config": config, "command": command, "results": results}
    write_atomic(out / "results.json", json.dumps(payload, indent=2, default=str) + "\n")
    gpus = ", ".join(g.get("name", "?") for g in env.get("gpus", []) or []) or "none"
    tables = [markdown_table(results, columns), ""] if sections is None else [
        part for heading, rows, cols in sections if rows for part in (f"## {heading}", "", markdown_table(rows, cols), "")]
    md = [
        f"# {title}",
        "",
        *tables,
        *([notes, ""] if notes else []),
        f"Command: `{command}`",
        "",
        f"Environment: torch {env.get('torch')}, CUDA {env.get('cuda')}, GPU {gpus}, "
        f"driver {env.get('driver')}, python {env.get('python')}, CPU {env.get('cpu')}",
        "",
    ]
    write_atomic(out / "results.md", "\n".join(md))
    return out / "results.json"


_STATUS_STYLE = {"ok": "green", "skipped": "dim", "accuracy_fail": "yellow", "oom": "red", "error": "red"}


def status_cell(status: str) -> str:
    """A row status as rich markup (green ok, red failures, dim skips)."""
    style = _STATUS_STYLE.get(status, "")
    return f"[{style}]{status}[/{style}]" if style else status


def pyplot():
    """matplotlib.pyplot on the headless Agg backend, or None when matplotlib (kiln[plot]) is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def write_result_files(out_dir: str | Path, rows: list[dict[str, Any]], *, env: dict, config: dict, command: str,
                       title: str, columns: list[str], plot) -> dict[str, Path]:
    """results.json + results.md and, when `plot(rows, path, title)` can draw, results.png."""
    out = Path(out_dir)
    written = {"json": write_results(out, env=env, config=config, results=rows, columns=columns, title=title,
                                     command=command)}
    written["md"] = out / "results.md"
    png = plot(rows, out / "results.png", title)
    if png is not None:
        written["png"] = png
    return written


def rich_table(rows: list[dict[str, Any]], title: str, shown: list[str], headers: dict[str, str], cell,
               notes=None):
    """A rich Table: one column per key in `shown` (titled from `headers`), `cell(key, row)` for the
    text, the status coloured; `notes(row)` lines, if given, go dim under their row. Laid out one
    block per row where the terminal is too narrow for the columns (kiln.tables.Adaptive)."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for key in shown:
        table.add_column(headers.get(key, key), overflow="fold")
    for row in rows:
        table.add_row(*(status_cell(row["status"]) if key == "status" else cell(key, row) for key in shown))
        for line in notes(row) if notes else ():
            table.add_row(f"  [dim]{line}[/dim]", *[""] * (len(shown) - 1))
    return Adaptive(table)
