"""Where a bench or autotune command writes its results, and how it shows them on the terminal:
the table, then one line of row statuses and the files written. Shared by the `kiln bench` and
`kiln autotune` subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def claim_results_dir(args: argparse.Namespace, default_name: str) -> Path:
    """`--out` (or a new run dir named after `default_name`), refused (exit 2) while another command
    holds it or when it already holds results, then created; a failure's error.log lands there."""
    from kiln.bench.results import refuse_held_results  # here: `kiln --help` imports no torch
    from kiln.runtime import default_run_dir

    out = Path(args.out) if args.out else default_run_dir(default_name)
    refuse_held_results(out)
    out.mkdir(parents=True, exist_ok=True)
    args.output_dir = out
    return out


def show_results(rows: list[dict], renderable, written: dict) -> None:
    """Print a bench's table and a one-line summary of row statuses and files written."""
    from rich.console import Console  # imported when a bench prints: `kiln --help` does without it

    console = Console()
    if not console.is_terminal:  # piped or logged: do not squeeze the table into 80 columns
        console = Console(width=220)
    console.print(renderable)
    counts = {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    print(f"kiln: {len(rows)} rows ({summary}); wrote {', '.join(str(p) for p in written.values())}")


def stopped_line(result, out: Path) -> str | None:
    """The line an autotune search stopped early ends with: why, and that what it measured is kept."""
    if not getattr(result, "stop_reason", None):
        return None
    measured = sum(1 for t in result.trials if t.row.get("status") != "skipped")
    return (f"kiln: stopped early ({result.stop_reason}): the {measured} rows measured are kept in {out}; "
            f"{len(result.not_tried)} candidates were not tried (listed there, with why)")


def remove_scratch_on_interrupt(out: Path, scratch: list[Path]) -> None:
    """After Ctrl-C: remove what is only scratch (initial weights, corpora, the checkpoints of a
    point's training run; paths this command created under `out`) and say what was kept and
    removed; the results written so far stay. The caller re-raises the interruption (exit 130)."""
    import shutil

    def size(path: Path) -> int:
        if path.is_file():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())

    removed = []
    for path in scratch:
        if path.exists() and out.resolve() in path.resolve().parents:
            freed = size(path)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(f"{path} ({freed / 2**30:.2f} GiB)")
    kept = [p.name for p in (out / "results.json", out / "results.md") if p.exists()]
    said = f"kept {', '.join(kept)} (the rows finished before it) in {out}" if kept else "no row had finished"
    print(f"kiln: interrupted: {said}; removed scratch: {', '.join(removed) or 'none'}", file=sys.stderr, flush=True)
