"""How a bench command shows its results on the terminal: the table, then one line of row
statuses and the files written. Shared by the `kiln bench` subcommands."""

from __future__ import annotations


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
