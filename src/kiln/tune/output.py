"""What `kiln autotune` writes: the winning config as TOML (loadable by `kiln train --config`) and
the evidence: results.json/results.md (the results contract, docs/architecture.md#results; one row per candidate,
measured or not) and results.png; plus the table shown on screen."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from kiln.bench.compile.compile_report import cell_text, plot
from kiln.bench.compile.recipes import recipe_config
from kiln.bench.ratios import ratio_text
from kiln.bench.results import write_results
from kiln.config.load import dump_toml, load_config
from kiln.config.schema import Config
from kiln.safe_io import append_text, check_target, write_atomic
from kiln.tables import Adaptive
from kiln.tune import space as sp
from kiln.tune.search import TuneResult
from kiln.tune.space import versus_default

COLUMNS = ["stage", "candidate", "role", "status", "compile_s", "step_ms", "step_ms_p10", "step_ms_p90",
           "eager_fp32_step_ms", "speedup_vs_eager_fp32", "speedup_vs_default", "throughput", "tflops", "peak_frac",
           "peak_mem_bytes",
           "graph_breaks", "recompiles", "accuracy", "capture", "wall_s", "noisy", "reason", "flags"]
BEST_FILE = "best.toml"


def result_rows(result: TuneResult) -> list[dict[str, Any]]:
    """Every measured row (bench columns plus stage, candidate, role, speedup_vs_default) and a
    `skipped` row for each candidate not tried, with the reason."""
    rows: list[dict[str, Any]] = []
    for trial in result.trials:
        role = ""
        if trial is result.winner_trial:
            role = "winner"
        elif trial.recipe == result.default and (trial is result.default_trial or trial.stage == "baseline"):
            role = "default"
        ratio = versus_default(result.trials, trial, result.default, result.default_trial)
        rows.append({**trial.row, **sp.recipe_fields(trial.recipe), "stage": trial.stage,
                     "candidate": sp.describe(trial.recipe), "role": role, "speedup_vs_default": ratio,
                     "wall_s": trial.wall_s})
    for item in result.not_tried:
        rows.append({**item.get("fields", {}), "stage": item.get("stage"), "candidate": item["recipe"], "role": "",
                     "status": "skipped", "reason": f"not tried: {item['reason']}"})
    for row in result.extra.get("rows", []):
        rows.append(row)
    return rows


def best_config(base: Config, result: TuneResult) -> Config:
    """The config with the winning keys (the config as it was when its own recipe won)."""
    cfg = copy.deepcopy(base) if result.winner == result.default else recipe_config(base, result.winner)
    if cfg.compile.mode == "default" and base.compile.mode == "":
        cfg.compile.mode = ""  # torch's default mode either way: not a change to report
    if result.extra.get("strategy"):  # several processes: whole-step capture needs one
        cfg.distributed.strategy = result.extra["strategy"]
        cfg.compile.cudagraphs = False
    return cfg


def _header(result: TuneResult, model: str, device: str, precisions: list[str]) -> list[str]:
    lines = [f"kiln autotune: the fastest recipe measured for {model} on {device} (evidence: results.md)"]
    winner = result.winner_trial
    if winner is not None and winner.row.get("step_ms"):
        gain = result.speedup_vs_default
        versus = f", {gain:.2f}x the config's own recipe (as its row's `vs config`)" if gain else ""
        reference = winner.row.get("eager_fp32_step_ms")
        beside = f" ({reference:.4g} ms timed beside it)" if reference else ""
        lines.append(f"winner: {sp.describe(result.winner)}: {winner.row['step_ms']:.4g} ms/step, "
                     f"{winner.score:.2f}x eager fp32{beside}{versus} (decided on the {result.decided_on} rows)")
    lines.append(f"precisions searched: {', '.join(precisions)} (a precision change changes the numerics; "
                 "every candidate was checked against eager at its own precision and an fp64 reference)")
    return lines


def write_best(out: Path, base: Config, result: TuneResult, *, model: str, device: str,
               precisions: list[str]) -> Path:
    """The full resolved config with the winning keys, as TOML; read back through load_config so a
    file that `kiln train --config` would reject is never written."""
    cfg = best_config(base, result)
    text = "".join(f"# {line}\n" for line in _header(result, model, device, precisions)) + "\n" + dump_toml(cfg)
    path = out / BEST_FILE
    tmp = out / (BEST_FILE + ".tmp")
    write_atomic(tmp, text)
    load_config(tmp)
    check_target(path)
    tmp.replace(path)
    return path


def changed_keys(base: Config, best: Config) -> dict[str, tuple[Any, Any]]:
    """Dotted keys whose value differs between two configs: {key: (before, after)}."""
    out: dict[str, tuple[Any, Any]] = {}
    for section in dataclasses.fields(base):
        a, b = getattr(base, section.name), getattr(best, section.name)
        for f in dataclasses.fields(a):
            if getattr(a, f.name) != getattr(b, f.name):
                out[f"{section.name}.{f.name}"] = (getattr(a, f.name), getattr(b, f.name))
    return out


def write_evidence(out: Path, result: TuneResult, *, env: dict, config: dict, command: str, title: str,
                   changes: dict[str, tuple[Any, Any]], precisions: list[str], model: str, device: str) -> list[Path]:
    rows = result_rows(result)
    written = [write_results(out, env=env, config=config, results=rows, columns=COLUMNS, title=title,
                             command=command)]
    md = out / "results.md"
    extra = ["", "## Decision", ""] + [f"- {line}" for line in _header(result, model, device, precisions)]
    if changes:
        extra += ["", f"Keys `{BEST_FILE}` changes: " + ", ".join(f"`{k}` {a!r} -> {b!r}" for k, (a, b) in changes.items())]
    else:
        extra += ["", f"`{BEST_FILE}` keeps the config's own recipe."]
    if result.notes:
        extra += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    if result.not_tried:
        extra += ["", "## Not tried", ""] + [f"- {n['recipe']} ({n.get('stage')}): {n['reason']}" for n in result.not_tried]
    append_text(md, "\n".join(extra) + "\n")
    written.append(md)
    measured = [r for r in rows if not str(r.get("reason") or "").startswith("not tried")]
    labels = [f"{r['candidate']} [{r['stage']}]" + (f" {r['role']}" if r.get("role") else "") for r in measured]
    png = plot(measured, out / "results.png", title, labels)
    if png is not None:
        written.append(png)
    return written


def render_table(result: TuneResult, title: str):
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    shown = ["stage", "candidate", "role", "status", "compile_s", "step_ms", "eager_fp32_step_ms",
             "speedup_vs_eager_fp32", "speedup_vs_default", "accuracy"]
    headers = {"compile_s": "compile s", "step_ms": "step ms", "eager_fp32_step_ms": "eager fp32 ms (beside)",
               "speedup_vs_eager_fp32": "vs eager fp32", "speedup_vs_default": "vs config"}
    for key in shown:
        table.add_column(headers.get(key, key), overflow="fold")

    def cell(key: str, row: dict[str, Any]) -> str:
        if key in ("stage", "candidate", "role", "status"):
            return str(row.get(key) or "")
        if key in ("speedup_vs_eager_fp32", "speedup_vs_default") and row.get(key) is not None:
            return ratio_text(row[key], bool(row.get("noisy")))
        if key in ("step_ms", "eager_fp32_step_ms") and row.get(key) is not None:
            return f"{row[key]:.4g}"
        return cell_text(key, row.get(key))

    for row in result_rows(result):
        style = "bold green" if row.get("role") == "winner" else "dim" if row["status"] == "skipped" else ""
        table.add_row(*(cell(k, row) for k in shown), style=style)
        notes = [row["reason"]] if row.get("reason") and row["status"] != "ok" else []
        notes += [f for f in str(row.get("flags") or "").split("; ") if f]
        for note in notes:
            table.add_row("", f"[dim]{escape(note)}[/dim]", *[""] * (len(shown) - 2))
    return Adaptive(table, title_column=1)


def evidence_config(cfg: Config, opts, result: TuneResult, changes: dict[str, tuple[Any, Any]], *,
                    budget_min: float) -> dict[str, Any]:
    """The `config` block of results.json: the base config and what the search did with it."""
    space = opts.space
    return {"base": dataclasses.asdict(cfg),
            "autotune": {"budget_min": budget_min, "precisions": space.precisions, "modes": space.modes,
                         "scopes": space.scopes, "regional": space.regional, "capture": space.cudagraphs,
                         "steps": opts.steps, "warmup": opts.warmup, "elapsed_s": result.elapsed_s,
                         "decided_on": result.decided_on, "winner": dataclasses.asdict(result.winner),
                         "default": dataclasses.asdict(result.default), "speedup_vs_default": result.speedup_vs_default,
                         "changes": {k: list(v) for k, v in changes.items()},
                         "not_tried": [{k: v for k, v in n.items() if k != "fields"} for n in result.not_tried],
                         "notes": result.notes, "stopped_early": result.stopped_early, "stop_reason": result.stop_reason,
                         "strategy": result.extra.get("strategy")}}
