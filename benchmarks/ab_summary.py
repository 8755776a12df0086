"""The figures of benchmarks/ab_headline.sh's runs, tree A against tree B: median, spread, B/A, verdict.

    python benchmarks/ab_summary.py OUT/ab --out OUT/ab/summary [--decode-quant none,int4@triton] [--decode-batch 1]
        [--tol-pct 2]
        [--a-label before --b-label after --a-commit SHA --b-commit SHA --a-tree .ab/base/src --b-tree src]

Reads RUNS_DIR/runs.tsv (one line per scheduled run: case, tree a|b, round, ok|failed|skipped,
seconds, output dir under RUNS_DIR, note) and each started run's own file: `kiln train`'s summary.json (median
ms/step), `kiln bench llm`'s results.json (decode tok/s of each kiln row, one figure per quantization
and batch size) and `kiln bench compile`'s results.json (ms/step of the kiln row that is not eager).
A figure's value per tree is the median over that tree's runs, its spread (max - min) / median;
B/A is the ratio of the medians, and a figure is `worse` when B is worse than A by more than the
tolerance in its own direction (ms/step up, tok/s down), `missing` when a tree has no run of it.
Writes results.json and results.md through kiln.bench.results.write_results.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kiln.bench.results import write_results  # kiln of the tree on PYTHONPATH (B's on the device)
from kiln.monitor.env import collect_env

CASES = ("train_1b", "decode_3b", "mlp", "vit")
TREES = ("a", "b")


@dataclass(frozen=True)
class Figure:
    key: str
    case: str
    title: str
    unit: str
    better: Literal["lower", "higher"]


def decode_key(quant: str, batch: int) -> str:
    """A decode figure's key: `decode_3b_QUANT_tok_s` at batch 1 (as before batches were added), else
    `decode_3b_QUANT_bBATCH_tok_s`."""
    return f"decode_3b_{quant}_tok_s" if batch == 1 else f"decode_3b_{quant}_b{batch}_tok_s"


def figures(decode_quant: list[str], decode_batch: tuple[int, ...] = (1,)) -> list[Figure]:
    """Every figure the cases give, in the script's case order."""
    return [Figure("train_1b_step_ms", "train_1b", "1B LLM training step (kiln train, bf16-master)", "ms/step", "lower"),
            *(Figure(decode_key(q, b), "decode_3b", f"3B decode, batch {b}, {'bf16' if q == 'none' else q}",
                     "tok/s", "higher") for b in decode_batch for q in decode_quant),
            Figure("mlp_step_ms", "mlp", "seed MLP b128 fp32, regional + capture", "ms/step", "lower"),
            Figure("vit_step_ms", "vit", "ViT-B/16 b64 bf16-true, compile + capture", "ms/step", "lower")]


def read_runs(runs_dir: Path) -> list[dict[str, Any]]:
    runs = []
    for line in (runs_dir / "runs.tsv").read_text().splitlines():
        if not line.strip():
            continue
        case, tree, rnd, status, secs, out, note = (line.split("\t") + [""] * 7)[:7]
        runs.append({"case": case, "tree": tree, "round": int(rnd), "status": status, "seconds": float(secs or 0),
                     "dir": out, "note": note})
    return runs


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_figures(case: str, out: Path) -> dict[str, float]:
    """The figures one finished run wrote (none when its file is missing or holds no ok row)."""
    if case == "train_1b":
        summary = _json(out / "summary.json") or {}
        ms = summary.get("step_ms_median") if summary.get("status") == "completed" else None
        return {} if ms is None else {"train_1b_step_ms": float(ms)}
    rows = (_json(out / "results.json") or {}).get("results", [])
    ok = [r for r in rows if r.get("status") == "ok"]
    if case == "decode_3b":
        return {decode_key(r["quant"], int(r.get("batch", 1))): float(r["decode_tok_s"]) for r in ok
                if str(r.get("engine", "")).startswith("kiln") and r.get("decode_tok_s") is not None}
    compiled = [r for r in ok if r.get("runner") == "kiln" and r.get("mode") != "eager" and r.get("step_ms")]
    return {f"{case}_step_ms": float(compiled[0]["step_ms"])} if len(compiled) == 1 else {}


def compare(fig: Figure, a: list[float], b: list[float], tol: float) -> dict[str, Any]:
    """One row of the comparison: each tree's median and spread, B/A and the verdict."""
    row: dict[str, Any] = {"figure": fig.key, "title": fig.title, "unit": fig.unit, "better": fig.better,
                           "a_samples": a, "b_samples": b, "n_a": len(a), "n_b": len(b)}
    for tree, samples in (("a", a), ("b", b)):
        med = statistics.median(samples) if samples else None
        row[f"{tree}_median"] = med
        row[f"{tree}_spread"] = (max(samples) - min(samples)) / med if samples and med else None
    if not a or not b:
        missing = " and ".join(t.upper() for t, s in (("a", a), ("b", b)) if not s)
        return {**row, "status": "skipped", "reason": f"no finished run of tree {missing}", "ratio_b_a": None,
                "worse_pct": None, "verdict": "missing"}
    ratio = row["b_median"] / row["a_median"]
    worse = (ratio - 1.0) if fig.better == "lower" else (1.0 - ratio)
    return {**row, "status": "ok", "reason": None, "ratio_b_a": ratio, "worse_pct": 100.0 * worse,
            "verdict": "worse" if round(worse, 9) > tol else "ok"}  # exactly the tolerance is not worse


def summarise(runs_dir: Path, runs: list[dict[str, Any]], decode_quant: list[str], tol: float,
              decode_batch: tuple[int, ...] = (1,)) -> list[dict[str, Any]]:
    """One row per figure of the cases that were scheduled."""
    samples: dict[tuple[str, str], list[float]] = {}
    for run in runs:  # a run that failed late (its cap, say) keeps the rows it finished: each has its own status
        if run["status"] != "skipped":
            for key, value in run_figures(run["case"], runs_dir / run["dir"]).items():
                samples.setdefault((key, run["tree"]), []).append(value)
    scheduled = {run["case"] for run in runs}
    return [compare(f, samples.get((f.key, "a"), []), samples.get((f.key, "b"), []), tol)
            for f in figures(decode_quant, decode_batch) if f.case in scheduled]


def notes(runs: list[dict[str, Any]], labels: dict[str, str]) -> str:
    """The schedule as it ran: every run in order, with its time and, when it did not finish, why."""
    lines = ["## Runs", "", "| round | case | tree | status | s | note |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['round']} | {r['case']} | {labels[r['tree']]} | {r['status']} | {r['seconds']:.0f} | {r['note']} |"
              for r in runs]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs_dir", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--decode-quant", default="none,int4@triton")
    p.add_argument("--decode-batch", default="1", help="batch sizes of the decode case, comma-separated")
    p.add_argument("--tol-pct", type=float, default=2.0)
    for tree in TREES:
        p.add_argument(f"--{tree}-label", default=tree.upper())
        p.add_argument(f"--{tree}-commit", default="unknown")
        p.add_argument(f"--{tree}-tree", default="")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    runs = read_runs(args.runs_dir)
    quant = [q for q in args.decode_quant.split(",") if q]
    try:
        batches = tuple(int(b) for b in args.decode_batch.split(",") if b)
    except ValueError:
        p.error(f"--decode-batch: {args.decode_batch!r} is not a comma-separated list of batch sizes (e.g. 1,16)")
    rows = summarise(args.runs_dir, runs, quant, args.tol_pct / 100.0, batches)
    labels = {t: f"{getattr(args, f'{t}_label')} ({getattr(args, f'{t}_commit')})" for t in TREES}
    config = {"tol_pct": args.tol_pct, "decode_quant": quant, "decode_batch": list(batches),
              **{f"{t}": {"label": getattr(args, f"{t}_label"), "commit": getattr(args, f"{t}_commit"),
                          "tree": getattr(args, f"{t}_tree")} for t in TREES},
              "runs": runs}
    worse = [r["figure"] for r in rows if r["verdict"] == "worse"]
    missing = [r["figure"] for r in rows if r["verdict"] == "missing"]
    head = (f"A = {labels['a']}, B = {labels['b']}; worse = B worse than A by more than {args.tol_pct:g} % "
            f"in the figure's direction. {len(rows) - len(worse) - len(missing)} ok, {len(worse)} worse"
            f"{': ' + ', '.join(worse) if worse else ''}, {len(missing)} missing{': ' + ', '.join(missing) if missing else ''}.")
    columns = ["title", "unit", "better", "a_median", "b_median", "ratio_b_a", "worse_pct", "a_spread", "b_spread",
               "n_a", "n_b", "verdict"]
    write_results(args.out, env=collect_env(), config=config, results=rows, columns=columns,
                  title="A/B of the headline figures", command=" ".join(["python", "benchmarks/ab_summary.py", *argv]),
                  notes=head + "\n\n" + notes(runs, labels))
    print(head)
    for r in rows:
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        print(f"{r['title']:48} A {fmt(r['a_median'], '.4g'):>8}  B {fmt(r['b_median'], '.4g'):>8} {r['unit']:8} "
              f"B/A {fmt(r['ratio_b_a'], '.4f')}  {r['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
