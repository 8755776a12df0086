"""A kiln command once per case of module settings, the cases interleaved round by round, then one
table: per row of its results (engine, quantization, batch), each case's median of one figure, its
spread, and its change against the first case, with a verdict that says when the spreads are too
wide to rank.

    python benchmarks/settings_sweep.py --out DIR [--rounds 2] [--budget-s 440] [--min-left-s 45] \\
        --case 'off:' --case 'x:kiln.kernels.triton_rows.SWAP_X_ONCE=True' \\
        [--metric decode_step_ms --better lower --key engine,quant,batch] \\
        -- bench llm --model llama-3.2-3b --batch 16,32 --quant int4@triton ...

A case is NAME:SETTING ..., each SETTING as benchmarks/with_settings.py takes it (MODULE.NAME=VALUE;
none: the tree's defaults). The first case is the reference. Every setting is checked before the
first run (the module imports and defines the name): a bad one, or `--out` among the kiln
arguments, exits 2. Runs go in the order round 1's cases, round 2's cases, ..., each a process of
its own (with_settings.py) writing DIR/runs/NAME_ROUND; a run starts only with --min-left-s of
--budget-s left and is stopped at the budget. Writes DIR/results.json and results.md, also after
Ctrl-C (exit 130) from the runs that finished; exit 1 when a run failed, timed out or was skipped.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from with_settings import parse_setting, resolve_setting  # noqa: E402  (benchmarks/ is not a package)

NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Case:
    name: str
    settings: tuple[str, ...]


def parse_case(text: str) -> Case:
    """NAME:SETTING ... -> Case; ValueError saying what is wrong."""
    name, sep, rest = text.partition(":")
    if not sep or not NAME.match(name):
        raise ValueError(f"--case {text!r}: expected NAME:SETTING ..., NAME of a-z, 0-9 and _ (e.g. 'off:')")
    settings = tuple(rest.split())
    for setting in settings:
        parse_setting(setting)
    return Case(name, settings)


def check_settings(cases: list[Case]) -> None:
    """Each setting's module imports and defines its name (ValueError naming the first that does not)."""
    for case in cases:
        for setting in case.settings:
            try:
                resolve_setting(setting)
            except ValueError as exc:
                raise ValueError(f"--case {case.name}: {exc}") from None


def schedule(cases: list[Case], rounds: int) -> list[tuple[Case, int]]:
    """Every case once per round, round by round: (case, round) in run order."""
    return [(case, r) for r in range(1, rounds + 1) for case in cases]


def launch_process(argv: list[str], timeout_s: float) -> Literal["ok", "failed", "timeout"]:
    """One run as a process of its own; its output goes to this one's."""
    try:
        code = subprocess.run([sys.executable, str(HERE / "with_settings.py"), *argv], timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
        return "timeout"
    return "ok" if code == 0 else "failed"


def run_all(plan: list[tuple[Case, int]], kiln_args: list[str], runs_dir: Path, budget_s: float, min_left_s: float,
            launch: Callable[[list[str], float], str] = launch_process,
            clock: Callable[[], float] = time.monotonic) -> list[dict[str, Any]]:
    """Each planned run while time is left: its case, round, status (ok, failed, timeout, skipped,
    interrupted: Ctrl-C, after which the rest are skipped), seconds and output folder (under runs_dir)."""
    start = clock()
    runs: list[dict[str, Any]] = []
    for case, rnd in plan:
        folder = f"{case.name}_{rnd}"
        left = budget_s - (clock() - start)
        stopped = any(r["status"] == "interrupted" for r in runs)
        if stopped or left < min_left_s:
            note = "after Ctrl-C" if stopped else f"{left:.0f} s of the budget left (--min-left-s {min_left_s:g})"
            runs.append({"case": case.name, "round": rnd, "status": "skipped", "seconds": 0.0, "dir": folder,
                         "note": note})
            continue
        print(f"settings_sweep: {folder}: {' '.join(case.settings) or '(defaults)'}", file=sys.stderr, flush=True)
        t0 = clock()
        try:
            status = launch([*case.settings, "--", *kiln_args, "--out", str(runs_dir / folder)], left)
        except KeyboardInterrupt:
            status = "interrupted"
        runs.append({"case": case.name, "round": rnd, "status": status, "seconds": clock() - t0, "dir": folder,
                     "note": ""})
    return runs


def samples(runs: list[dict[str, Any]], runs_dir: Path, metric: str,
            keys: list[str]) -> dict[tuple, dict[str, list[float]]]:
    """Per results row (its `keys` values), per case: the metric of each run that wrote it (rows with
    status ok; a run that failed late keeps the rows it finished)."""
    out: dict[tuple, dict[str, list[float]]] = {}
    for run in runs:
        path = runs_dir / run["dir"] / "results.json"
        if run["status"] == "skipped" or not path.exists():
            continue
        for row in json.loads(path.read_text()).get("results", []):
            if row.get("status") == "ok" and row.get(metric) is not None:
                key = tuple(row.get(k) for k in keys)
                out.setdefault(key, {}).setdefault(run["case"], []).append(float(row[metric]))
    return out


def compare(values: list[float], ref: list[float], better: Literal["lower", "higher"]) -> dict[str, Any]:
    """One case against the reference: median, spread (max - min) / median in %, change of the
    median in %, and a verdict: better / worse when the change exceeds both spreads, else `within
    spread` (or `one sample` when either has fewer than two)."""
    med = statistics.median(values)
    spread = 100.0 * (max(values) - min(values)) / med
    ref_med = statistics.median(ref)
    ref_spread = 100.0 * (max(ref) - min(ref)) / ref_med
    change = 100.0 * (med / ref_med - 1.0)
    if len(values) < 2 or len(ref) < 2:
        verdict = "one sample"
    elif abs(change) <= max(spread, ref_spread):
        verdict = "within spread"
    else:
        verdict = "better" if (change < 0) == (better == "lower") else "worse"
    return {"n": len(values), "median": med, "spread_pct": spread, "change_pct": change, "verdict": verdict}


def table(found: dict[tuple, dict[str, list[float]]], cases: list[Case], keys: list[str],
          better: Literal["lower", "higher"]) -> list[dict[str, Any]]:
    """One row per results row and case, the reference case first."""
    ref_name = cases[0].name
    rows = []
    for key, by_case in found.items():
        base = {k: v for k, v in zip(keys, key)}
        for case in cases:
            row = {**base, "case": case.name, "settings": " ".join(case.settings) or "(defaults)"}
            values, ref = by_case.get(case.name), by_case.get(ref_name)
            if not values or not ref:
                missing = case.name if not values else ref_name
                rows.append({**row, "status": "skipped", "reason": f"no finished run of {missing}", "n": 0,
                             "median": None, "spread_pct": None, "change_pct": None, "verdict": "missing"})
                continue
            rows.append({**row, "status": "ok", "reason": None, **compare(values, ref, better)})
            if case.name == ref_name:
                rows[-1].update(change_pct=0.0, verdict="reference")
    return rows


def main(argv: list[str] | None = None, launch: Callable[[list[str], float], str] = launch_process,
         clock: Callable[[], float] = time.monotonic) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="settings_sweep.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--case", action="append", required=True, help="NAME:SETTING ... (the first is the reference)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=440.0)
    p.add_argument("--min-left-s", type=float, default=45.0)
    p.add_argument("--metric", default="decode_step_ms")
    p.add_argument("--better", choices=["lower", "higher"], default="lower")
    p.add_argument("--key", default="engine,quant,batch", help="the results fields that name a row")
    args = p.parse_args(argv[:cut])
    kiln_args = argv[cut + 1:]
    try:
        if not kiln_args:
            raise ValueError("no kiln command after `--` (e.g. -- bench llm --model llama-3.2-3b ...)")
        if any(a == "--out" or a.startswith("--out=") for a in kiln_args):
            raise ValueError("--out among the kiln arguments: each run's --out is DIR/runs/NAME_ROUND")
        if args.rounds < 1:
            raise ValueError(f"--rounds {args.rounds}: at least 1")
        cases = [parse_case(text) for text in args.case]
        if len({c.name for c in cases}) < len(cases):
            raise ValueError(f"--case: names repeat ({', '.join(c.name for c in cases)})")
        check_settings(cases)
    except ValueError as exc:
        print(f"settings_sweep.py: {exc}", file=sys.stderr)
        return 2
    keys = [k for k in args.key.split(",") if k]
    runs_dir = args.out / "runs"
    runs = run_all(schedule(cases, args.rounds), kiln_args, runs_dir, args.budget_s, args.min_left_s, launch, clock)
    rows = table(samples(runs, runs_dir, args.metric, keys), cases, keys, args.better)
    write(args.out, rows, runs, keys, cases[0].name, args, kiln_args)
    if any(r["status"] == "interrupted" for r in runs):
        print(f"settings_sweep.py: interrupted; the runs that finished are in {args.out}/results.md", file=sys.stderr)
        return 130
    return 0 if all(r["status"] == "ok" for r in runs) else 1


def write(out: Path, rows: list[dict[str, Any]], runs: list[dict[str, Any]], keys: list[str], reference: str,
          args: Any, kiln_args: list[str]) -> None:
    from kiln.bench.results import write_results
    from kiln.monitor.env import collect_env

    lines = ["## Runs", "", "| round | case | status | s | note |", "|---|---|---|---|---|"]
    lines += [f"| {r['round']} | {r['case']} | {r['status']} | {r['seconds']:.0f} | {r['note']} |" for r in runs]
    command = "python benchmarks/settings_sweep.py " + " ".join(
        [f"--out {args.out}", *(f"--case '{c}'" for c in args.case), f"--rounds {args.rounds}",
         f"--metric {args.metric}", f"--better {args.better}", "--", *kiln_args])
    write_results(out, env=collect_env(), config={"metric": args.metric, "better": args.better, "runs": runs},
                  results=rows, columns=[*keys, "case", "n", "median", "spread_pct", "change_pct", "verdict"],
                  title=f"Settings sweep: {args.metric} ({args.better} is better), against case {reference}",
                  command=command, notes="\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
