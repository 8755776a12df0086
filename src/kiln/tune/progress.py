"""The progress display of `kiln autotune`: a rich progress bar on stderr and one line per candidate;
piped or logged (no terminal, so no bar), also one line when a candidate starts, so a row that
takes minutes never leaves the output silent."""

from __future__ import annotations


class RichProgress:
    """kiln.tune.search.Progress on a rich progress bar (stderr), with one line per candidate."""

    def __init__(self, budget_s: float):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        self.bar = Progress(TextColumn("[bold]autotune[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn(f"of {budget_s / 60:.3g} min"), console=console)
        self.task = self.bar.add_task("starting", total=0)

    def __enter__(self) -> RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def log(self, message: str) -> None:
        self.bar.console.print(message, highlight=False, markup=False, soft_wrap=True)  # one line each, piped too

    def planned(self, count: int) -> None:
        self.bar.update(self.task, total=(self.bar.tasks[0].total or 0) + count)

    def started(self, stage: str, label: str) -> None:
        self.bar.update(self.task, description=f"{stage}: {label}")
        if not self.bar.console.is_terminal:
            task = self.bar.tasks[0]
            self.log(f"[{stage}] {label}: measuring (row {int(task.completed) + 1} of {int(task.total or 0)}, "
                     f"{task.elapsed or 0:.0f} s in)")

    def finished(self, stage: str, label: str, row, best: str | None) -> None:
        self.bar.update(self.task, advance=1, description=f"{stage}: best so far {best or '-'}")
