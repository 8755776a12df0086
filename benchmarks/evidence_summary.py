"""The figures benchmarks/evidence.sh's outputs stand for, in one JSON and one markdown table.

Reads, under DIR: `<model>_clip<c>/results.json` (kiln bench compile rows), `crosscheck/
crosscheck_<model>.json` (benchmarks/plain_crosscheck.py) and `llm/results.json` (kiln bench
llm), and writes DIR/../summary.json and summary.md (or `--out`):
- per model and clip value: the bench's plain row (interleaved `step_ms`, and `step_ms_alone`
  timed back to back) beside the standalone loop's (alone and interleaved with an eager twin),
  their ratios, and whether the plain row is within 5 % of the standalone loop;
- the LLM rows (kiln and gpt-fast): tokens/s and the ceiling fractions, with the ceilings.
Missing inputs are listed, not fatal: a time-boxed run summarizes what it finished.

    python benchmarks/evidence_summary.py DIR [--out OUTDIR]
"""

from __future__ import annotations

import argparse
import json
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


def plain_rows(root: Path, missing: list[str]) -> list[dict]:
    out = []
    for model in MODELS:
        check = _load(root / "crosscheck" / f"crosscheck_{model}.json", missing) or {"runs": []}
        standalone = {run["grad_clip"]: run for run in check["runs"]}
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
                     "bench_status": plain.get("status")}
            entry["within_5pct_interleaved"] = within(entry["bench_plain_step_ms"], entry["standalone_step_ms_interleaved"])
            entry["within_5pct_alone"] = within(entry["bench_plain_step_ms_alone"], entry["standalone_step_ms_alone"])
            entry["within_5pct_bench_vs_standalone"] = within(entry["bench_plain_step_ms"], entry["standalone_step_ms_alone"])
            out.append(entry)
    return out


LLM_FIELDS = ("engine", "quant", "status", "decode_tok_s", "request_tok_s", "request_vs_gpt_fast", "roofline_frac",
              "roofline_spec_frac", "roofline_copy_frac", "prefill_peak_frac", "prefill_spec_frac", "weight_bytes",
              "peer_commit", "reason")


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
    lines = ["# evidence summary", "", "## plain baseline vs a standalone loop (no kiln code)", "",
             "| model | grad_clip | schedule | bench plain ms (interleaved) | standalone ms (interleaved) | "
             "bench plain ms (alone) | standalone ms (alone) | within 5% (interleaved / alone) |",
             "|---|---|---|---|---|---|---|---|"]
    for e in summary["plain"]:
        lines.append(f"| {e['what']} | {e['grad_clip']:g} | {_fmt(e['schedule'])} | {_fmt(e['bench_plain_step_ms'])} | "
                     f"{_fmt(e['standalone_step_ms_interleaved'])} | {_fmt(e['bench_plain_step_ms_alone'])} | "
                     f"{_fmt(e['standalone_step_ms_alone'])} | {_fmt(e['within_5pct_interleaved'])} / "
                     f"{_fmt(e['within_5pct_alone'])} |")
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
    args = p.parse_args(argv)
    missing: list[str] = []
    summary = {"plain": plain_rows(args.root, missing), "llm": llm(args.root, missing), "missing": missing}
    out = args.out or args.root.parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    text = markdown(summary)
    (out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
