"""What a long command is doing right now, on stderr, so minutes of compiling are not silence.

On a terminal, a live line with a spinner and the seconds elapsed in the current phase
(`[2/5] fp32 task inductor/default/model: compiling  0:01:12`), with finished rows printed
above it. Piped or redirected, one plain line when each phase starts (`kiln: [2/5] ...:
compiling`), flushed at once, so a log shows where a run is and what it was doing when it
stopped. Nothing goes to stdout (JSON or tables there stay clean), and an output stream that
closes (a pipe whose reader exited) silences the display instead of stopping the work.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any


class Activity:
    """`with Activity() as act: act.phase("compiling ..."); act.log("a finished row")`."""

    def __init__(self, stream: IO[str] | None = None, *, live: bool | None = None, prefix: str = "kiln: "):
        self.stream = stream
        self.prefix = prefix
        self._live_wanted = live
        self._progress: Any = None
        self._task: Any = None
        self._broken = False
        self.phase_started: float | None = None
        self.current: str | None = None

    @property
    def out(self) -> IO[str]:
        return self.stream if self.stream is not None else sys.stderr

    def _is_live(self) -> bool:
        if self._live_wanted is not None:
            return self._live_wanted
        try:
            return self.out.isatty()
        except (AttributeError, ValueError):
            return False

    def __enter__(self) -> Activity:
        if self._is_live():
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            console = Console(file=self.out)
            # One redraw a second (rich's default is 10): the refresh thread shares the interpreter
            # with the steps being timed, and a host-bound step must not pay for the display.
            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                      console=console, transient=True, refresh_per_second=1)
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._progress is not None:
            progress, self._progress = self._progress, None
            try:
                progress.stop()
            except OSError:
                self._broken = True

    def _write(self, line: str) -> None:
        if self._broken:
            return
        try:
            self.out.write(line + "\n")
            self.out.flush()
        except (OSError, ValueError):  # a closed pipe or terminal: stop showing, keep working
            self._broken = True

    def phase(self, message: str) -> None:
        """A new phase begins: the live line shows it (its elapsed time restarts), or one line when piped."""
        self.current, self.phase_started = message, time.monotonic()
        if self._progress is not None:
            if self._task is not None:
                self._progress.remove_task(self._task)
            self._task = self._progress.add_task(message, total=None)
            return
        self._write(f"{self.prefix}{message}")

    def log(self, message: str) -> None:
        """A line that stays (a finished row): above the live line on a terminal, plain otherwise."""
        if self._progress is not None:
            try:
                self._progress.console.print(message, highlight=False, markup=False, soft_wrap=True)
            except OSError:
                self._broken = True
            return
        self._write(message)
