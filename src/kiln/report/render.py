"""A report is a list of blocks (headings, paragraphs, tables, images) rendered twice: markdown
with the PNGs beside it, and one self-contained HTML page with the PNGs inlined as base64."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.bench.results import format_cell
from kiln.safe_io import write_atomic

REPORT_FILES = ("report.md", "report.html")
"""What `kiln report` writes into its output dir (and report_files/, its PNGs)."""


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Para:
    text: str


@dataclass
class Table:
    headers: list[str]
    rows: list[list[Any]]


@dataclass
class Image:
    name: str  # file name, e.g. loss.png
    png: bytes
    caption: str


Block = Heading | Para | Table | Image


def cell(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(cell(v) for v in value) or "—"
    if isinstance(value, dict):
        return ", ".join(f"{k}={cell(v)}" for k, v in value.items())
    return format_cell(value)


def to_markdown(blocks: list[Block], files_dir: str) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Para):
            out += [b.text, ""]
        elif isinstance(b, Table):
            out.append("| " + " | ".join(b.headers) + " |")
            out.append("|" + "---|" * len(b.headers))
            out += ["| " + " | ".join(cell(c).replace("|", "\\|") for c in row) + " |" for row in b.rows]
            out.append("")
        elif isinstance(b, Image):
            out += [f"![{b.caption}]({files_dir}/{b.name})", ""]
    return "\n".join(out)


_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1100px;
       color: #1f2328; padding: 0 1em; line-height: 1.45; }
h1 { border-bottom: 1px solid #d0d7de; padding-bottom: .3em; }
h2 { margin-top: 1.6em; border-bottom: 1px solid #eaeef2; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .6em 0 1.2em; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 4px 9px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
tr:nth-child(even) td { background: #fbfbfc; }
figure { margin: 1em 0 1.6em; }
figure img { max-width: 100%; border: 1px solid #eaeef2; }
figcaption { font-size: 13px; color: #57606a; }
code { background: #f6f8fa; padding: 1px 4px; border-radius: 4px; }
.scroll { overflow-x: auto; }
.status-ok { color: #1a7f37; } .status-bad { color: #cf222e; }
td.num { white-space: nowrap; text-align: right; font-variant-numeric: tabular-nums; }
td.winner { font-weight: bold; color: #1a7f37; }
td { max-width: 32em; }
"""


def _inline(text: str) -> str:
    """Escape, then turn `code` spans into <code>."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def to_html(blocks: list[Block], title: str) -> str:
    body: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{_inline(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            body.append(f"<p>{'<br>'.join(_inline(line) for line in b.text.splitlines())}</p>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{html.escape(h)}</th>" for h in b.headers)
            rows = []
            for row in b.rows:
                cells = []
                for h, c in zip(b.headers, row):
                    css = ""
                    if h == "status":
                        css = ' class="status-ok"' if c == "ok" else ' class="status-bad"'
                    elif h == "role" and c == "winner":
                        css = ' class="winner"'
                    elif isinstance(c, (int, float)) and not isinstance(c, bool):
                        css = ' class="num"'
                    cells.append(f"<td{css}>{html.escape(cell(c))}</td>")
                rows.append("<tr>" + "".join(cells) + "</tr>")
            body.append(f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody>'
                        "</table></div>")
        elif isinstance(b, Image):
            data = base64.b64encode(b.png).decode()
            body.append(f'<figure><img alt="{html.escape(b.caption)}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{html.escape(b.caption)}</figcaption></figure>")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_report(blocks: list[Block], out: Path, title: str) -> dict[str, Path]:
    """report.md + report_files/*.png, and report.html (self-contained)."""
    out.mkdir(parents=True, exist_ok=True)
    files = out / "report_files"
    images = [b for b in blocks if isinstance(b, Image)]
    if images:
        files.mkdir(exist_ok=True)
        for img in images:
            write_atomic(files / img.name, img.png)
    write_atomic(out / "report.md", to_markdown(blocks, files.name))
    write_atomic(out / "report.html", to_html(blocks, title))
    return {"md": out / "report.md", "html": out / "report.html", "files": files}
