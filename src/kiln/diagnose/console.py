"""Console reports (rich) for `kiln explain` and `kiln doctor`; the JSON carries the same facts."""

from __future__ import annotations

import os
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kiln.tables import Adaptive


def _where(file: str | None, line: int | None) -> str:
    if not file:
        return "?"
    try:
        shown = os.path.relpath(file)
    except ValueError:  # another drive on Windows
        shown = file
    if shown.startswith(".."):
        shown = file
    return f"{shown}:{line}"


def _summary_line(r: dict[str, Any]) -> Text:
    text = Text()
    text.append(f"{r['target']}", style="bold")
    text.append(f"  torch {r['torch']}, backend {r['backend']}, inputs {' '.join(r['inputs'])} ({r['input_source']})\n")
    if r.get("mode"):
        text.append(f"run as: {r['mode']}\n", style="dim")
    if r.get("clean"):
        text.append("clean: no graph breaks and no recompiles on these inputs", style="bold green")
        text.append(f" ({r['graph_count']} graph(s), ops per graph {r['ops_per_graph']})")
    else:
        style = "green" if r["graph_break_count"] == 0 else "yellow"
        text.append(f"{r['graph_count']} graph(s), {r['graph_break_count']} graph break(s)", style=style)
        style = "green" if not r["recompiles"] else "yellow"
        text.append(f", {len(r['recompiles'])} recompile problem(s)", style=style)
        text.append(f", ops per graph {r['ops_per_graph']}")
    if r.get("backward_ops_per_graph"):
        text.append(f", backward ops per graph {r['backward_ops_per_graph']}")
    if r["fullgraph_ok"]:
        text.append("\nfullgraph=True: works (one graph)", style="green")
    else:
        b = r.get("fullgraph_blocker") or {}
        where = f" at {_where(b.get('file'), b.get('line'))}" if b.get("file") else ""
        verdict = "compiles, but not as one graph as you run it" if b.get("fullgraph_compiles") else "fails"
        text.append(f"\nfullgraph=True: {verdict} (first blocker: {b.get('category', 'the run failed')}{where})",
                    style="red")
        if b.get("note"):
            text.append(f"\n  {b['note']}", style="dim")
    for hit in r.get("recompile_limit_hits", []):
        text.append(f"\nrecompile limit hit: `{hit['function']}` ({_where(hit['file'], hit['line'])}) reached "
                    f"torch._dynamo.config.{hit['limit']} ({hit['value']}); calls matching none of its graphs run it "
                    "eagerly", style="red")
    for frame in r.get("eager_frames", []):
        text.append(f"\nran eagerly after a break at {_where(frame['file'], frame['break_line'])}: {frame['cost']}",
                    style="red")
    return text


def _breaks_table(breaks: list[dict[str, Any]]) -> Adaptive:
    table = Table(title="Graph breaks", show_lines=True, expand=True)
    table.add_column("#", justify="right", width=3)
    table.add_column("category", ratio=2)
    table.add_column("where", ratio=3)
    table.add_column("torch says", ratio=4)
    table.add_column("fix", ratio=5)
    for i, b in enumerate(breaks, 1):
        where = Text(_where(b["file"], b["line"]) + "\n")
        where.append(b["code"] or "", style="cyan")
        category = b["category"] + ("\n(whole function ran eagerly)" if b.get("frame_skipped") else "")
        if b.get("count", 1) > 1:
            category += f"\n({b['count']} times per forward)"
        table.add_row(str(i), category, where, b["explanation"] or b["reason"], b["hint"])
    return Adaptive(table, keep=("where",), title_column=2)


def _recompiles_table(recompiles: list[dict[str, Any]]) -> Adaptive:
    """One row per distinct failing guard; a graph break splits forward into several functions
    (resume functions), each recompiling for the same reason, listed under the first."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in recompiles:
        groups.setdefault((r["category"], r["guard"]), []).append(r)
    table = Table(title=f"Recompiles ({len(recompiles)})", show_lines=True, expand=True)
    table.add_column("#", justify="right", width=3)
    table.add_column("failing guard", ratio=4)
    table.add_column("where", ratio=3)
    table.add_column("fix", ratio=5)
    for i, ((category, guard), rows) in enumerate(groups.items(), 1):
        first = rows[0]
        where = Text(f"{_where(first['file'], first['line'])} ({first['function']})\n")
        where.append(first["code"] or "", style="cyan")
        if len(rows) > 1:
            where.append(f"\n+ {len(rows) - 1} more function(s) after graph breaks: "
                         + ", ".join(f"line {r['line']}" for r in rows[1:]), style="dim")
        if first.get("times", 0) > 1:
            where.append(f"\n({first['times']} recompiles of this value)", style="dim")
        table.add_row(str(i), Text(f"[{category}]\n{guard}"), where, first["hint"])
    return Adaptive(table, keep=("where",), title_column=2)


def _probes_table(probes: list[dict[str, Any]]) -> Table:
    """What kiln's `--vary` calls showed: expected behaviour, not problems, unless marked."""
    table = Table(title="If your inputs change (kiln's --vary probes)", show_lines=False, expand=True)
    table.add_column("changed", ratio=2)
    table.add_column("calls", ratio=3)
    table.add_column("what torch.compile does", ratio=6)
    for p in probes:
        style = "green" if p["expected"] else "yellow"
        table.add_row(p["vary"], ", ".join(p["variants"]), Text(p["verdict"], style=style))
    return table


def _expectations_table(rows: list[dict[str, Any]], doctor: bool = False) -> Table:
    table = Table(title="Seed expectations vs this torch", show_lines=True, expand=True)
    table.add_column("construct", ratio=2)
    table.add_column("expected", ratio=1)
    table.add_column("observed", ratio=1)
    table.add_column("why", ratio=6)
    for row in rows:
        if doctor:
            expected, observed = row["expected_failure"] or "none", row["observed_failure"] or "none"
        else:
            expected = "break" if row["expected_break"] else "no break"
            observed = {True: "break", False: "no break", None: "?"}[row["observed_break"]]
        style = "green" if expected == observed else "yellow"
        line = f" (line {row['line']})" if row.get("line") else ""
        table.add_row(row["construct"] + line, expected, Text(observed, style=style), row["note"])
    return table


def render_explain(r: dict[str, Any]) -> Group:
    parts: list[Any] = [Panel(_summary_line(r), title="kiln explain", expand=True)]
    if r["breaks"]:
        parts.append(_breaks_table(r["breaks"]))
    elif r.get("fullgraph_blocker"):
        parts.append(_breaks_table([r["fullgraph_blocker"]]))
    if r["recompiles"]:
        parts.append(_recompiles_table(r["recompiles"]))
    if r.get("probes"):
        parts.append(_probes_table(r["probes"]))
    for c in r.get("collectives", []):
        parts.append(Text(f"collective {c['op']} in graph {c['graph']} at {_where(c.get('file'), c.get('line'))}: "
                          f"{c.get('code', '')}\n  {c['hint']}", style="magenta"))
    if r.get("seed_expectations"):
        parts.append(_expectations_table(r["seed_expectations"]))
    errors = [run for run in r.get("runs", []) if run["status"] != "ok"]
    for run in errors:
        parts.append(Text(f"run {run['label']} failed: {run['error']}", style="red"))
    for op in dict.fromkeys(run["op"] for run in errors if run.get("op")):  # once per op, in order
        run = next(run for run in errors if run.get("op") == op)
        where = f" (called at {_where(run.get('file'), run.get('line'))})" if run.get("file") else ""
        parts.append(Text(f"why: {run['diagnosis']}{where}\nfix: {run['fix']}"))
    for note in r.get("notes", []):
        parts.append(Text(f"note: {note}", style="dim"))
    return Group(*parts)


def render_fullgraph(r: dict[str, Any]) -> Group:
    if r["fullgraph_ok"]:
        return Group(Text(f"fullgraph: yes - {r['target']} compiles as one graph (torch {r['torch']})", style="green"))
    b = r.get("fullgraph_blocker") or {}
    head = Text(f"fullgraph: no - first blocker at {_where(b.get('file'), b.get('line'))}: [{b.get('category')}]\n",
                style="red")
    head.append(f"  {b.get('code', '')}\n", style="cyan")
    head.append(f"  torch: {b.get('reason', '')}\n  fix: {b.get('hint', '')}")
    if b.get("note"):
        head.append(f"\n  note: {b['note']}", style="dim")
    parts: list[Any] = [head]
    first_break = r["breaks"][0] if r.get("breaks") else None
    if first_break and (first_break["file"], first_break["line"]) != (b.get("file"), b.get("line")):
        parts.append(Text(
            f"note: without fullgraph the first break is at {_where(first_break['file'], first_break['line'])} "
            f"[{first_break['category']}]; fullgraph=True traces differently (recent torch captures `.item()` under "
            "fullgraph: torch/_dynamo/variables/tensor.py, method_item), so fix the blocker above and check again",
            style="dim"))
    return Group(*parts)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def render_doctor(r: dict[str, Any]) -> Group:
    table = Table(title=f"kiln doctor {r['target']} (torch {r['torch']}, reference {r['reference']}, tol {r['tol']:g}"
                  f"{', --train' if r['train'] else ''})", expand=True, show_lines=True)
    for col, ratio in (("stage", 3), ("status", 2), ("max abs err", 1), ("max rel err", 1), ("s", 1), ("error", 6)):
        table.add_column(col, ratio=ratio)
    colors = {"ok": "green", "crash": "red", "accuracy_fail": "yellow"}
    for s in r["stages"]:
        table.add_row(s["backend"], Text(s["status"], style=colors.get(s["status"], "")), _fmt(s["max_abs_err"]),
                      _fmt(s["max_rel_err"]), _fmt(s.get("seconds")), s["error"] or "")
    parts: list[Any] = [table]
    first = r["first_failure"]
    if first is None:
        parts.append(Text("every stage matches eager within the harness rule", style="green"))
    else:
        text = Text(f"first failure: {first['backend']} ({first['status']}) - the layer it adds: {first['layer']}\n",
                    style="bold red")
        if first.get("where"):
            text.append(f"  at {_where(first['where']['file'], first['where']['line'])}: {first['where']['code']}\n")
        if first.get("diagnosis"):
            text.append(f"  why: {first['diagnosis']}\n", style="")
            text.append("  fix: " + first["fix"].replace("\n", "\n       ") + "\n", style="")
        crossref = first.get("crossref")
        if crossref:
            confirmed = "fails too: confirmed" if crossref["status"] != "ok" else "passes: not confirmed"
            text.append(f"  {crossref['backend']} {confirmed} ({crossref['meaning']})\n", style="")
        for line in first.get("torch_advice", []):
            text.append(f"  torch: {line}\n", style="dim")
        bis = r.get("bisect")
        if bis:
            text.append(f"  bisector: {bis.get('summary') or bis.get('note')}\n")
        if r.get("repro"):
            text.append(f"  repro: python {_where(r['repro'], None).rsplit(':', 1)[0]}\n")
        parts.append(text)
    if r.get("seed_expectations"):
        parts.append(_expectations_table(r["seed_expectations"], doctor=True))
    for note in r.get("notes", []):
        parts.append(Text(f"note: {note}", style="dim"))
    return Group(*parts)
