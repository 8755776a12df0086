"""Rich tables that stay readable in a narrow terminal.

A table with many columns squeezed into 100 columns folds every cell into slivers, or cuts them
with an ellipsis: the file:line of a finding or its fix is what gets lost. `Adaptive` wraps a
built `rich.table.Table` and decides at render time, from the width it is given: when every
column fits at a readable width (and the `keep` columns, such as file:line, fit whole) it prints
the table; otherwise it prints one block per row, `column: value` lines under the row's title,
which wrap at word boundaries and never cut a value.

A row whose cells after the first are all empty is a note of the row above it (the bench tables
put reasons and flags there); it stays with its row in both layouts.
"""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

READABLE = 24
"""A column narrower than its content is readable down to this many cells (wrapped words)."""
SHORT = 24
"""Values up to this long share a line in the per-row layout; longer ones get a line each."""


def plain(cell: Any) -> str:
    """The text of a cell (markup resolved, styles dropped)."""
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        try:
            return Text.from_markup(cell).plain
        except Exception:  # not markup after all (brackets in a path or a message)
            return cell
    return str(cell)


def _longest_line(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


def _first_line(text: str) -> int:
    lines = text.splitlines()
    return cell_len(lines[0]) if lines else 0


class Adaptive:
    """`console.print(Adaptive(table, keep=("where",)))`: the table when it fits, else one block per row.

    `keep`: headers of the columns whose first line (a path:line, a command) must fit whole in the
    table layout. `title_column`: the column that titles each block in the per-row layout."""

    def __init__(self, table: Table, *, keep: tuple[str, ...] = (), title_column: int = 0, readable: int = READABLE):
        self.table = table
        self.keep = keep
        self.title_column = title_column
        self.readable = readable

    # -- the data, read back from the table ----------------------------------------------------
    def headers(self) -> list[str]:
        return [plain(c.header) for c in self.table.columns]

    def rows(self) -> list[tuple[list[Any], list[str]]]:
        """[(cells, notes)]: each row's cells and the note rows that follow it."""
        columns = [list(c.cells) for c in self.table.columns]
        count = max((len(c) for c in columns), default=0)
        out: list[tuple[list[Any], list[str]]] = []
        for i in range(count):
            cells = [col[i] if i < len(col) else "" for col in columns]
            others = [plain(c).strip() for j, c in enumerate(cells) if j != self.title_column]
            if out and not any(others):
                note = plain(cells[self.title_column]).strip()
                if note:
                    out[-1][1].append(note)
                continue
            out.append((cells, []))
        return out

    def needed_width(self) -> int:
        """Cells the table layout needs: each column at its content's width up to `readable`
        (its header's longest word at least), `keep` columns at their first line's full width."""
        rows = self.rows()
        total = 1 if self.table.show_edge else -1
        for j, (column, header) in enumerate(zip(self.table.columns, self.headers(), strict=True)):
            texts = [plain(cells[j]) for cells, _ in rows]
            longest = max((_longest_line(t) for t in texts), default=0)
            width = min(longest, self.readable)
            if header in self.keep:
                width = max(width, max((_first_line(t) for t in texts), default=0))
            words = max((cell_len(w) for w in header.split()), default=0)
            width = max(width, words, column.width or 0, column.min_width or 0)
            total += width + 2 * self.table.padding[1] + 1
        return total

    # -- rendering -------------------------------------------------------------------------------
    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if options.max_width >= self.needed_width():
            yield self._unclipped()
            return
        yield from self.records()

    def _unclipped(self) -> Table:
        """The table with no cell cut: every column folds instead of ending in an ellipsis, and
        each `keep` column is at least as wide as its longest first line."""
        rows = self.rows()
        for j, (column, header) in enumerate(zip(self.table.columns, self.headers(), strict=True)):
            if column.overflow == "ellipsis":
                column.overflow = "fold"
            if header in self.keep:  # a fixed width: rich shares out ratio columns ignoring min_width
                column.width = max([column.width or 0, column.min_width or 0,
                                    *(_first_line(plain(c[j])) for c, _ in rows)])
                column.ratio = None
        return self.table

    def records(self) -> list[Any]:
        """The per-row layout: the title line of each row, then its values and notes, indented
        (wrapped lines keep the indent)."""
        from rich.padding import Padding

        out: list[Any] = []
        if self.table.title:
            out.append(Text(plain(self.table.title), style="bold"))
        headers = self.headers()
        for cells, notes in self.rows():
            title = Text("- ", style="bold")
            title.append(plain(cells[self.title_column]).replace("\n", " "), style="bold")
            out.append(title)
            short: list[str] = []
            for j, (header, cell) in enumerate(zip(headers, cells, strict=True)):
                text = plain(cell).strip()
                if j == self.title_column or not text or text == "-":
                    continue
                if "\n" not in text and cell_len(text) <= SHORT and header not in self.keep:
                    short.append(f"{header}: {text}")
                    continue
                line = Text.assemble((f"{header}: ", "dim"), text.replace("\n", " / "))
                out.append(Padding(line, (0, 0, 0, 2), expand=False))
            if short:
                out.append(Padding(Text("  ·  ".join(short)), (0, 0, 0, 2), expand=False))
            out.extend(Padding(Text(note, style="dim"), (0, 0, 0, 2), expand=False) for note in notes)
        return out
