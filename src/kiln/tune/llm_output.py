"""What `kiln autotune` writes for an LLM: best.toml (the full config with the winning keys, loadable
by `kiln train --config`) and the evidence, results.json/results.md (one row per candidate,
measured or not)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from kiln.bench.results import write_results
from kiln.config.load import dump_toml, load_config
from kiln.config.schema import Config
from kiln.safe_io import check_target, write_atomic
from kiln.tune import llm_space as sp
from kiln.tune.llm_search import LlmTuneResult, configure
from kiln.tune.output import BEST_FILE, changed_keys

COLUMNS = ["stage", "candidate", "role", "status", "tokens_per_s", "speedup_vs_default", "step_ms", "peak_mem_gib",
           "loss_last", "accuracy", "first_step_s", "wall_s", "reason"]


def result_rows(result: LlmTuneResult) -> list[dict[str, Any]]:
    base = result.trial(result.default)
    rows = []
    for t in result.trials:
        role = "winner" if t.candidate == result.winner and t is result.trial(result.winner) else (
            "default" if t.candidate == result.default else "")
        speed = sp.tokens_per_s(t.row)
        ratio = speed / base.row["tokens_per_s"] if speed and base is not None else None
        mem = t.row.get("peak_mem_bytes")
        rows.append({**t.row, **dataclasses.asdict(t.candidate), "stage": t.stage, "candidate": t.candidate.describe(),
                     "role": role, "speedup_vs_default": ratio, "peak_mem_gib": mem / 2**30 if mem else None})
    for n in result.not_tried:
        rows.append({"stage": n["stage"], "candidate": n["candidate"], "role": "", "status": "skipped",
                     "reason": f"not tried: {n['reason']}"})
    return rows


def best_config(base: Config, result: LlmTuneResult) -> Config:
    return base if result.winner == result.default else configure(base, result.winner)


def write_best(out: Path, base: Config, result: LlmTuneResult, *, model: str, device: str) -> Path:
    """The full config with the winning keys as TOML, read back through load_config first."""
    cfg = best_config(base, result)
    gain = result.speedup_vs_default
    lines = [f"kiln autotune: the fastest LLM settings measured for {model} on {device} (evidence: results.md)",
             f"winner: {result.winner.describe()}" + (f", {gain:.2f}x the config's own tokens/s" if gain else "")]
    text = "".join(f"# {line}\n" for line in lines) + "\n" + dump_toml(cfg)
    tmp = out / (BEST_FILE + ".tmp")
    write_atomic(tmp, text)
    load_config(tmp)
    path = out / BEST_FILE
    check_target(path)
    tmp.replace(path)
    return path


def write_evidence(out: Path, base: Config, result: LlmTuneResult, opts, *, env: dict, command: str,
                   title: str) -> list[Path]:
    changes = changed_keys(base, best_config(base, result))
    config = {"base": dataclasses.asdict(base),
              "autotune": {"kind": "llm", "budget_min": opts.budget_s / 60, "space": dataclasses.asdict(opts.space),
                           "steps": opts.steps, "warmup": opts.warmup, "loss_tol": opts.loss_tol,
                           "elapsed_s": result.elapsed_s, "winner": dataclasses.asdict(result.winner),
                           "default": dataclasses.asdict(result.default),
                           "speedup_vs_default": result.speedup_vs_default,
                           "changes": {k: list(v) for k, v in changes.items()}, "not_tried": result.not_tried,
                           "notes": result.notes, "stopped_early": result.stopped_early,
                           "stop_reason": result.stop_reason}}
    lines = ["## Decision", "", f"- winner: {result.winner.describe()}"]
    if result.speedup_vs_default:
        lines.append(f"- {result.speedup_vs_default:.2f}x the tokens/s of the config's own settings "
                     f"({result.default.describe()})")
    lines.append("- " + ("keys best.toml changes: " + ", ".join(f"`{k}` {a!r} -> {b!r}" for k, (a, b) in changes.items())
                         if changes else "best.toml keeps the config's own settings"))
    lines += [f"- {n}" for n in result.notes]
    path = write_results(out, env=env, config=config, results=result_rows(result), columns=COLUMNS, title=title,
                         command=command, notes="\n".join(lines))
    return [path, out / "results.md"]
