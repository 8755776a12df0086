"""The figures benchmarks/evidence.sh's outputs stand for, in one JSON and one markdown table.

Reads, under DIR: `<model>_clip<c>/results.json` (kiln bench compile rows), the standalone
loop's `crosscheck_<model>.json` (benchmarks/plain_crosscheck.py) from `crosscheck_before/` and
`crosscheck_after/` (the script run before and after the bench: a bracket) or from one
`crosscheck/`, and `llm/results.json` (kiln bench llm), and writes DIR/../summary.json and
summary.md (or `--out`):
- per model and clip value: the bench's plain row (interleaved `step_ms`, and `step_ms_alone`
  timed back to back) beside the standalone loop's (alone and interleaved with an eager twin; in a
  bracket the mean of its two runs, each run listed, and how far the second moved from the first),
  and whether the plain row is within 5 % of the standalone loop;
- the LLM rows (kiln and gpt-fast): tokens/s and the ceiling fractions, with the ceilings;
- with `--parts repeats`, benchmarks/mlp_noise.sh's layout (`script/crosscheck_mlp.json` holding
  every script run, `bench_clip<c>_<i>/results.json` each bench run): per clip value each tool's
  run figures, their medians, the gap between the medians and whether it is within 5 %, and how
  far the script's own runs spread (largest / smallest - 1).
Missing inputs are listed, not fatal: a time-boxed run summarizes what it finished.

    python benchmarks/evidence_summary.py DIR [--out OUTDIR] [--parts plain,llm,repeats]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

TOLERANCE = 0.05
MODELS = {"mlp": "seed MLP b128 fp32, reduce-overhead", "vit": "timm ViT-B/16 b64 bf16-mixed, default mode"}


def _load(path: Path, missing: list[str]):
    if not path.is_file():
        missing.append(str(path))
        return None
    return json.loads(path.read_text())


def within(a: float | None, b: float | None, tolerance: float = TOLERANCE) -> bool | None:
    """|a / b - 1| <= tolerance, or None when either figure is missing."""
    if a is None or not b:
        return None
    return abs(a / b - 1) <= tolerance


BRACKET = ("crosscheck_before", "crosscheck_after")
TIMES = ("step_ms_alone", "step_ms_interleaved")


def _mean(values: list) -> float | None:
    return sum(values) / len(values) if values and None not in values else None


def standalone_runs(root: Path, model: str, missing: list[str]) -> dict[float, dict]:
    """The standalone loop's figures per clip value: one run's (`crosscheck/`), or in a bracket
    (`crosscheck_before/`, `crosscheck_after/`) the mean of both runs' medians, each run kept under
    `bracket_<time>` and the second's move from the first under `bracket_drift_<time>` (after /
    before - 1): a drift near the tolerance says the GPU, not a loop, moved the figures."""
    name = f"crosscheck_{model}.json"
    dirs = [d for d in BRACKET if (root / d / name).is_file()]
    if not dirs:
        check = _load(root / "crosscheck" / name, missing) or {"runs": []}
        return {run["grad_clip"]: run for run in check["runs"]}
    missing += [str(root / d / name) for d in BRACKET if d not in dirs]
    runs = [{r["grad_clip"]: r for r in _load(root / d / name, missing)["runs"]} for d in dirs]
    out = {}
    for clip in set().union(*runs):
        got = [run[clip] for run in runs if clip in run]
        entry = {"grad_clip": clip}
        for key in TIMES:
            values = [g.get(key) for g in got]
            entry[key] = _mean(values)
            entry[f"bracket_{key}"] = values
            if len(values) == 2 and None not in values:
                entry[f"bracket_drift_{key}"] = values[1] / values[0] - 1
        out[clip] = entry
    return out


def plain_rows(root: Path, missing: list[str]) -> list[dict]:
    out = []
    for model in MODELS:
        standalone = standalone_runs(root, model, missing)
        for clip in (0.0, 1.0):
            bench = _load(root / f"{model}_clip{clip:g}" / "results.json", missing)
            rows = [r for r in (bench or {}).get("results", []) if r["runner"] == "plain" and r["mode"] != "eager"]
            plain = rows[0] if rows else {}
            mine = standalone.get(clip, {})
            entry = {"model": model, "what": MODELS[model], "grad_clip": clip, "schedule": plain.get("schedule"),
                     "bench_plain_step_ms": plain.get("step_ms"), "bench_plain_step_ms_alone": plain.get("step_ms_alone"),
                     "bench_eager_step_ms": plain.get("eager_step_ms"),
                     "standalone_step_ms_alone": mine.get("step_ms_alone"),
                     "standalone_step_ms_interleaved": mine.get("step_ms_interleaved"),
                     **{k: v for k, v in mine.items() if k.startswith("bracket_")},
                     "bench_status": plain.get("status")}
            entry["within_5pct_interleaved"] = within(entry["bench_plain_step_ms"], entry["standalone_step_ms_interleaved"])
            entry["within_5pct_alone"] = within(entry["bench_plain_step_ms_alone"], entry["standalone_step_ms_alone"])
            entry["within_5pct_bench_vs_standalone"] = within(entry["bench_plain_step_ms"], entry["standalone_step_ms_alone"])
            out.append(entry)
    return out


LLM_FIELDS = ("engine", "quant", "status", "decode_tok_s", "request_tok_s", "request_vs_gpt_fast", "roofline_frac",
              "roofline_spec_frac", "roofline_copy_frac", "prefill_peak_frac", "prefill_spec_frac", "weight_bytes",
              "peer_commit", "reason")


def repeated_runs(root: Path, missing: list[str]) -> list[dict]:
    """Per clip value: the script's runs and the bench's plain-row runs (mlp_noise.sh), both timings."""
    script = _load(root / "script" / "crosscheck_mlp.json", missing)
    if script is None:
        return []
    out = []
    for clip in sorted({run["grad_clip"] for run in script["runs"]}):
        runs = [run for run in script["runs"] if run["grad_clip"] == clip]
        benches = []
        for path in sorted(root.glob(f"bench_clip{clip:g}_*/results.json")):
            rows = [r for r in json.loads(path.read_text())["results"]
                    if r.get("runner") == "plain" and r.get("mode") != "eager" and r.get("status") == "ok"]
            benches += rows[:1]
        entry = {"model": "mlp", "what": MODELS["mlp"], "grad_clip": clip, "script_runs": len(runs),
                 "bench_runs": len(benches)}
        for time, bench_time in (("step_ms_interleaved", "step_ms"), ("step_ms_alone", "step_ms_alone")):
            mine, theirs = [r[bench_time] for r in benches], [r[time] for r in runs]
            bench = statistics.median(mine) if mine else None
            alone = statistics.median(theirs) if theirs else None
            entry.update({f"bench_{time}": mine, f"script_{time}": theirs, f"bench_median_{time}": bench,
                          f"script_median_{time}": alone,
                          f"gap_{time}": bench / alone - 1 if bench is not None and alone else None,
                          f"within_5pct_{time}": within(bench, alone),
                          f"script_spread_{time}": max(theirs) / min(theirs) - 1 if theirs else None})
        out.append(entry)
    return out


def llm(root: Path, missing: list[str]) -> dict:
    bench = _load(root / "llm" / "results.json", missing)
    if bench is None:
        return {}
    return {"ceilings": bench["config"].get("ceilings"),
            "rows": [{k: r.get(k) for k in LLM_FIELDS} for r in bench["results"]]}


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "/")  # a reason quoting a traceback must not split the table


def markdown(summary: dict) -> str:
    lines = ["# evidence summary"]
    if summary["plain"]:
        lines += ["", "## plain baseline vs a standalone loop (no kiln code)", "",
                  "| model | grad_clip | schedule | bench plain ms (interleaved) | standalone ms (interleaved) | "
                  "bench plain ms (alone) | standalone ms (alone) | within 5% (interleaved / alone) |",
                  "|---|---|---|---|---|---|---|---|"]
    for e in summary["plain"]:
        lines.append(f"| {e['what']} | {e['grad_clip']:g} | {_fmt(e['schedule'])} | {_fmt(e['bench_plain_step_ms'])} | "
                     f"{_fmt(e['standalone_step_ms_interleaved'])} | {_fmt(e['bench_plain_step_ms_alone'])} | "
                     f"{_fmt(e['standalone_step_ms_alone'])} | {_fmt(e['within_5pct_interleaved'])} / "
                     f"{_fmt(e['within_5pct_alone'])} |")
    bracketed = [e for e in summary["plain"] if e.get("bracket_step_ms_interleaved")]
    if bracketed:
        lines += ["", "Standalone figures are the mean of the script's runs before and after the bench "
                  "(interleaved ms: before / after, drift):", ""]
        lines += [f"- {e['what']}, clip {e['grad_clip']:g}: "
                  + " / ".join(_fmt(v) for v in e["bracket_step_ms_interleaved"])
                  + (f", {e['bracket_drift_step_ms_interleaved']:+.1%}" if "bracket_drift_step_ms_interleaved" in e else "")
                  for e in bracketed]
    if summary.get("repeats"):
        lines += ["", "## repeated runs: medians over processes", "",
                  "| model | grad_clip | runs (script / bench) | bench ms (interleaved) | script ms (interleaved) | gap | "
                  "bench ms (alone) | script ms (alone) | gap | script's own spread (interleaved / alone) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for e in summary["repeats"]:
            gaps = [f"{e[k]:+.1%}" if e[k] is not None else "-" for k in ("gap_step_ms_interleaved", "gap_step_ms_alone")]
            spread = " / ".join(f"{e[k]:.0%}" if e[k] is not None else "-"
                                for k in ("script_spread_step_ms_interleaved", "script_spread_step_ms_alone"))
            lines.append(f"| {e['what']} | {e['grad_clip']:g} | {e['script_runs']} / {e['bench_runs']} | "
                         f"{_fmt(e['bench_median_step_ms_interleaved'])} | {_fmt(e['script_median_step_ms_interleaved'])} | "
                         f"{gaps[0]} | {_fmt(e['bench_median_step_ms_alone'])} | {_fmt(e['script_median_step_ms_alone'])} | "
                         f"{gaps[1]} | {spread} |")
    c = summary["llm"].get("ceilings") or {}
    if c:
        spec = (f"; datasheet ({c.get('spec_name')}, {c.get('spec_source')}): {c['spec_bytes_per_s'] / 1e9:.0f} GB/s, "
                f"{c['spec_flops_per_s'] / 1e12:.1f} TFLOP/s" if c.get("spec_bytes_per_s") and c.get("spec_flops_per_s")
                else "")
        lines += ["", f"Ceilings ({c.get('gpu_name')}, {c.get('dtype')}): read-only stream {_fmt((c.get('read_bytes_per_s') or 0) / 1e9)} "
                  f"GB/s ({c.get('read_kernel')}), copy {_fmt(c['copy_bytes_per_s'] / 1e9)} GB/s, best matmul "
                  f"{_fmt(c['matmul_flops_per_s'] / 1e12)} TFLOP/s (n={c.get('matmul_n')}){spec}"]
    rows = summary["llm"].get("rows", [])
    if rows:
        lines += ["", "## kiln bench llm (3B shape)", "", "| " + " | ".join(LLM_FIELDS) + " |",
                  "|" + "---|" * len(LLM_FIELDS)]
        lines += ["| " + " | ".join(_fmt(r.get(k)) for k in LLM_FIELDS) + " |" for r in rows]
    if summary["missing"]:
        lines += ["", "missing: " + ", ".join(summary["missing"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("root", type=Path)
    p.add_argument("--out", type=Path)
    p.add_argument("--parts", default="plain,llm", help="the halves the call ran (evidence.sh's PARTS): only "
                   "their inputs are reported missing")
    args = p.parse_args(argv)
    parts = set(args.parts.split(","))
    missing: list[str] = []
    summary = {"plain": plain_rows(args.root, missing) if "plain" in parts else [],
               "llm": llm(args.root, missing if "llm" in parts else []), "missing": missing}
    if "repeats" in parts:
        summary["repeats"] = repeated_runs(args.root, missing)
    out = args.out or args.root.parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    text = markdown(summary)
    (out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
