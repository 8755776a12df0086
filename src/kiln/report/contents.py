"""The content of a report: which tables and charts a run dir or a bench results dir gets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.errors import ConfigError
from kiln.outputs import refuse_held_by_another
from kiln.report import plots
from kiln.report.render import REPORT_FILES, Block, Heading, Image, Para, Table, write_report
from kiln.report.report_inputs import BenchData, RunData, load
from kiln.report.report_request import ReportRequest
from kiln.safe_io import check_target, read_bytes
from kiln.train.segments import describe_segments

MIB = 2**20

# Columns of results.json rows (the results contract, docs/architecture.md#results), by bench kind;
# anything else is generic.
KIND_COLUMNS = {
    "compile": ["model", "precision", "loss", "mode", "backend", "scope", "status", "compile_s", "step_ms",
                "eager_step_ms", "speedup", "eager_fp32_step_ms", "speedup_vs_eager_fp32", "throughput",
                "peak_mem_bytes", "graph_breaks", "recompiles", "accuracy", "noisy"],
    "scale": ["strategy", "world", "status", "throughput", "throughput_per_device", "efficiency"],
    "llm": ["engine", "quant", "status", "prefill_tok_s", "decode_tok_s", "ttft_ms", "peak_mem_bytes", "roofline_frac"],
    # kiln autotune (recipes or LLM knobs): each row's stage and role, so the same candidate measured
    # in two stages reads as two rows and the winner is marked.
    "autotune": ["stage", "candidate", "role", "status", "compile_s", "step_ms", "speedup_vs_eager_fp32",
                 "tokens_per_s", "speedup_vs_default", "peak_mem_bytes", "peak_mem_gib", "loss_last", "accuracy"],
}
# Figures worth a chart, in order, with the axis label and a reference line where one means something.
CHART_KEYS = [
    ("speedup", "speedup vs eager at the same precision (x)", 1.0), ("efficiency", "scaling efficiency (0..1)", 1.0),
    ("decode_tok_s", "decode tokens/s", None), ("prefill_tok_s", "prefill tokens/s", None),
    ("step_ms", "step time, ms", None), ("throughput", "throughput (samples/s)", None),
    ("throughput_per_device", "throughput per device", None), ("ttft_ms", "time to first token, ms", None),
    ("roofline_frac", "fraction of the bandwidth roofline", 1.0), ("ratio", "ratio", 1.0),
    ("idle_frac", "GPU idle fraction of the step", None), ("peak_mem_bytes", "peak memory, MiB", None),
]
IDENTITY_SKIP = {"status", "reason", "error", "accuracy"}
# What names a row in charts, by bench kind (generic: the string columns that vary).
LABEL_COLUMNS = {"compile": ["model", "precision", "loss", "mode", "backend", "scope"],
                 "scale": ["model", "strategy", "world"], "llm": ["model", "engine", "quant"]}


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fmt(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def _mib(v: Any) -> str | None:
    return f"{v / MIB:,.1f} MiB" if _num(v) else None


# --------------------------------------------------------------------------------------------- run


def run_blocks(data: RunData) -> tuple[str, list[Block]]:
    s, recs = data.summary or summary_from_records(data), data.records
    title = f"kiln run report: {data.path.name}"
    blocks: list[Block] = [Heading(title, 1)]
    comp = s.get("compile") or {}
    if not data.summary:
        blocks.append(Para("No summary.json: the run was killed (an OOM kill or SIGKILL leaves none) or is still "
                           "running. The figures below come from its config.toml and metrics.jsonl."))
    blocks.append(Para(
        f"Run dir `{data.path}`: status {s.get('status', 'unknown')}, {s.get('steps', len(recs))} steps, "
        f"model on {s.get('device_name') or s.get('device') or '?'}, precision {s.get('precision', '?')}, compile "
        f"{(comp.get('mode') + '/' + comp.get('scope', '')) if comp.get('enabled') else 'off'}, "
        f"{s.get('world_size', 1)} rank(s), strategy {s.get('strategy', 'none')}."))
    health = s.get("gpu_health") or {}
    rate_key = "tokens_per_s" if s.get("tokens_per_s") else "samples_per_s"
    rows = [
        ["loss (first → final)", f"{_fmt(s.get('first_loss'))} → {_fmt(s.get('final_loss'))}" if "final_loss" in s else None],
        ["step ms, median (p10–p90)", f"{s['step_ms_median']:.3f} ({s.get('step_ms_p10') or 0:.3f}–"
                                      f"{s.get('step_ms_p90') or 0:.3f})" if _num(s.get("step_ms_median")) else None],
        [rate_key.replace("_", " "), f"{s[rate_key]:,.1f}" if _num(s.get(rate_key)) else None],
        ["MFU", f"{100 * s['mfu']:.2f}%" if _num(s.get("mfu")) else None],
        ["peak memory", _mib(s.get("peak_mem_bytes"))],
        ["first step (compile, warm-up), s", s.get("first_step_s")],
        ["wall time, s" + (" (all segments)" if s.get("resumed") else ""),
         f"{s['wall_s']} (segments without a summary.json not counted)" if s.get("wall_s_complete") is False
         else s.get("wall_s")],
        ["resumed", describe_segments(s)],
        ["stragglers named", s.get("stragglers_seen")],
        ["GPU utilisation (mean), %", health.get("util_pct")],
        ["GPU temperature (max), °C", health.get("temp_c")],
        ["GPU power (mean), W", health.get("power_w")],
        ["GPU throttle reasons seen", health.get("throttle_reasons")],
    ]
    blocks += [Heading("Summary"), Table(["figure", "value"], [r for r in rows if r[1] is not None])]
    blocks += validation_blocks(recs)
    if s.get("error"):
        blocks.append(Para(f"Error: `{s['error']}`"))
    steady = [r for r in recs if not r.get("first_step")]
    blocks.append(Heading("Over the run"))
    blocks.append(Para("One point per log interval (`training.log_interval`). Throughput and MFU leave out the "
                       "first record: step 1 alone, with compilation and warm-up."))
    blocks.append(Image("loss.png", plots.lines(recs, "Loss", "loss", [("loss", "train loss (interval mean)"),
                                                                       ("eval_loss", "eval loss")],
                                                 styles={"eval_loss": "s--"}), "Loss over steps"))
    blocks.append(Image("throughput.png", plots.lines(steady, "Throughput", rate_key.replace("_per_s", "/s"),
                                                      [(rate_key, "all ranks"),
                                                       ("samples_per_s_per_device", "per device")]),
                        "Throughput over steps"))
    if any(_num(r.get("mfu")) for r in steady):
        mfu_png = plots.lines(steady, "Model FLOPs utilisation", "MFU, %", [("mfu", "MFU")], scale=100.0)
    else:  # no peak known for the device (e.g. a CPU): the achieved rate is still worth seeing
        mfu_png = plots.lines(steady, "Achieved TFLOP/s per device (no known peak for this device, so no MFU)",
                              "TFLOP/s", [("tflops", "TFLOP/s")], empty="FLOPs not counted (metrics.mfu=false)")
    blocks.append(Image("mfu.png", mfu_png, "MFU over steps"))
    blocks.append(Image("memory.png", plots.lines(recs, "Memory (peaks per interval)", "MiB", [
        ("max_allocated_bytes", "CUDA allocated"), ("max_reserved_bytes", "CUDA reserved"),
        ("gpu_mem_used_bytes", "NVML used (whole GPU)"), ("max_rss_bytes", "host RSS")], scale=1 / MIB),
        "Memory over steps"))
    why = ("no GPU health: a CPU run" if str(s.get("device", "cpu")).startswith("cpu") else
           "no GPU health in the records: metrics.gpu_health=false, nvidia-ml-py missing, or a run from before it")
    blocks.append(Image("gpu_health.png", plots.gpu_health(recs, why), "GPU health over steps"))
    if any(isinstance(r.get("step_ms_ranks"), list) for r in recs):
        blocks.append(Image("ranks.png", plots.per_rank(recs), "Per-rank timing over steps"))
    if data.profile:
        blocks += profile_blocks(data.profile)
    return title, blocks


def summary_from_records(data: RunData) -> dict[str, Any]:
    """What a run without summary.json can still say: its config's precision and compile settings,
    steps and losses from its records."""
    cfg = data.config or {}
    recs = [r for r in data.records if _num(r.get("loss"))]
    comp = cfg.get("compile") or {}
    out: dict[str, Any] = {
        "status": "killed or running (no summary.json)",
        "steps": max((r.get("step", 0) for r in data.records), default=0),
        "precision": (cfg.get("precision") or {}).get("policy", "?"),
        "compile": {"enabled": bool(comp.get("enabled")), "mode": comp.get("mode") or "default",
                    "scope": comp.get("scope", "model")},
        "device": (cfg.get("training") or {}).get("device"),
    }
    if recs:
        out.update(first_loss=recs[0]["loss"], final_loss=recs[-1]["loss"])
    return out


def validation_blocks(recs: list[dict[str, Any]], most: int = 12) -> list[Block]:
    """The held-out loss (and perplexity, for language models) of the eval passes: all of them, or
    `most` evenly spaced (the first and last always) plus the pass with the best eval loss; the
    text says which."""
    every = [r for r in recs if _num(r.get("eval_loss"))]
    if not every:
        return []
    best = min(every, key=lambda r: r["eval_loss"])
    evals = every
    if len(every) > most:
        picks = {round(i * (len(every) - 1) / (most - 1)) for i in range(most)} | {every.index(best)}
        evals = [every[i] for i in sorted(picks)]
    has_ppl = any(_num(r.get("eval_perplexity")) for r in evals)
    has_acc = any(_num(r.get("eval_accuracy")) for r in evals)
    columns = ["step", "train loss", "eval loss"] + (["eval perplexity"] if has_ppl else []) + (
        ["eval accuracy"] if has_acc else []) + [""]
    rows = []
    for r in evals:
        row = [r.get("step"), _fmt(r.get("loss")), _fmt(r["eval_loss"])]
        if has_ppl:
            row.append(f"{r['eval_perplexity']:,.2f}" if _num(r.get("eval_perplexity")) else "")
        if has_acc:
            row.append(_fmt(r.get("eval_accuracy")) if _num(r.get("eval_accuracy")) else "")
        rows.append([*row, "best eval loss" if r is best else ""])
    shown = (f"each of the {len(every)} eval passes" if evals is every else
             f"{len(evals)} of the {len(every)} eval passes (evenly spaced, the first, the last and the best)")
    return [Heading("Validation"), Para(f"Loss on the held-out data: {shown} (`training.eval_interval`, "
                                        "`training.eval_steps` batches each); perplexity = exp(eval loss). The best "
                                        f"eval loss, {_fmt(best['eval_loss'])}, was at step {best.get('step')}."),
            Table(columns, rows)]


def profile_blocks(p: dict[str, Any]) -> list[Block]:
    w = p.get("window", {})
    out: list[Block] = [Heading("Profile"), Para(
        f"{w.get('steps')} steps under torch.profiler: {w.get('step_ms', 0):.3f} ms/step; trace `{p.get('trace')}`.")]
    gpu = p.get("gpu") or {}
    if gpu.get("status") != "ok":
        out.append(Para(f"GPU figures: n/a: {gpu.get('reason', '')}"))
    else:
        idle = gpu["idle"]
        out.append(Table(["figure", "value"], [
            ["kernels per step", gpu["kernels_per_step"]], ["GPU busy ms/step", idle["busy_ms_per_step"]],
            ["GPU idle ms/step", idle["idle_ms_per_step"]], ["idle fraction", idle["idle_frac"]],
            ["gaps per step", idle["gaps_per_step"]], ["largest gap, us", max((g["us"] for g in idle["largest_gaps"]),
                                                                             default=None)]]))
        kinds = gpu["by_kind"]
        out.append(Image("profile_kinds.png", plots.bars(list(kinds), [v["share"] * 100 for v in kinds.values()],
                                                         "Share of kernel time by kind", "% of kernel time"),
                         "GPU kernel time by kind"))
        out.append(Table(["kernel", "calls/step", "total ms", "share"],
                         [[r["name"][:90], r["calls_per_step"], r["total_ms"], r["share"]] for r in gpu["top_kernels"][:10]]))
    cat = (p.get("memory") or {}).get("by_category") or {}
    if cat.get("status") == "ok":
        out.append(Table(["memory category", "at the peak", "own maximum"],
                         [[k, _mib(v), _mib(cat["max_by_category"][k])] for k, v in
                          sorted(cat["at_peak"].items(), key=lambda kv: -kv[1])]))
    return out


# ------------------------------------------------------------------------------------------- bench


def bench_kind(rows: list[dict[str, Any]]) -> str:
    keys = set().union(*(r.keys() for r in rows)) if rows else set()
    if {"stage", "candidate", "role"} <= keys:
        return "autotune"
    if "speedup" in keys and "mode" in keys:
        return "compile"
    if {"world", "efficiency"} <= keys:
        return "scale"
    if {"decode_tok_s", "engine"} & keys:
        return "llm"
    return "generic"


def bench_columns(rows: list[dict[str, Any]], kind: str) -> list[str]:
    present = list(dict.fromkeys(k for r in rows for k in r))
    scalar = [k for k in present if all(not isinstance(r.get(k), (dict, list)) for r in rows)]
    cols = [c for c in KIND_COLUMNS.get(kind, []) if c in present]
    if not cols:
        ident = [k for k in scalar if k not in IDENTITY_SKIP and any(isinstance(r.get(k), str) for r in rows)]
        nums = [k for k in scalar if any(_num(r.get(k)) for r in rows)]
        cols = ident + ["status"] + [k for k in nums if k not in ident][: max(4, 14 - len(ident))]
    return [c for c in cols if c in present]


def row_notes(rows: list[dict[str, Any]], labels: list[str]) -> list[Block]:
    """Each row's reason and flags as a numbered list under the table, not as table columns: long
    text in a cell makes a wide table with tall rows (horizontal scrolling)."""
    lines = [f"{i}. {label}: " + "; ".join(str(r[c]) for c in ("reason", "flags") if r.get(c))
             for i, (r, label) in enumerate(zip(rows, labels), 1) if r.get("reason") or r.get("flags")]
    return [Heading("Row notes", 3), Para("\n".join(lines))] if lines else []


def row_labels(rows: list[dict[str, Any]], columns: list[str], kind: str = "generic") -> list[str]:
    if kind == "autotune":
        return [f"{r.get('candidate')} [{r.get('stage')}]" + (" WINNER" if r.get("role") == "winner" else "")
                for r in rows]
    ident = LABEL_COLUMNS.get(kind) or [c for c in columns if c not in IDENTITY_SKIP
                                        and not any(_num(r.get(c)) for r in rows)]
    varying = [c for c in ident if len({str(r.get(c)) for r in rows}) > 1] or ident[:1]
    labels = []
    for r in rows:
        parts = [f"{c}={r[c]}" if _num(r[c]) else str(r[c]) for c in varying if r.get(c) is not None]
        # Two columns saying the same ("recipe" and "mode" both "eager") label once.
        labels.append(" ".join(dict.fromkeys(p.replace("_", " ") for p in parts)))
    return [lab or f"row {i}" for i, lab in enumerate(labels)]


def bench_blocks(data: BenchData) -> tuple[str, list[Block]]:
    rows, kind = data.rows, bench_kind(data.rows)
    title = f"kiln bench report: {data.path.name}"
    env = data.env
    gpus = ", ".join(g.get("name", "?") for g in env.get("gpus") or []) or "none"
    blocks: list[Block] = [Heading(title, 1), Para(
        f"`{data.path / 'results.json'}`: {len(rows)} rows ({kind}). Environment: torch {env.get('torch')}, "
        f"CUDA {env.get('cuda')}, GPU {gpus}, driver {env.get('driver')}, CPU {env.get('cpu')}.")]
    if data.command:
        blocks.append(Para(f"Command: `{data.command}`"))
    columns = bench_columns(rows, kind)
    table = [[i, *(_mib(r.get(c)) if c.endswith("_bytes") and _num(r.get(c)) else r.get(c) for c in columns)]
             for i, r in enumerate(rows, 1)]
    labels = row_labels(rows, columns, kind)
    blocks += [Heading("Results"), Table(["#", *columns], table), *row_notes(rows, labels)]
    notes = [r.get("status", "") if r.get("status") != "ok" else "" for r in rows]
    charts: list[Block] = []
    if kind == "scale":
        groups: dict[str, list[tuple[float, float]]] = {}
        for r in rows:
            if _num(r.get("world")) and _num(r.get("efficiency")):
                groups.setdefault(str(r.get("strategy", "")), []).append((r["world"], r["efficiency"]))
        if groups:
            charts.append(Image("efficiency.png", plots.series_by_group(groups, "Scaling efficiency", "ranks",
                                                                        "efficiency (per-device vs 1)"),
                                "Scaling efficiency over world size"))
    for key, label, ref in CHART_KEYS:
        values = [r.get(key) if _num(r.get(key)) else None for r in rows]
        if sum(v is not None for v in values) < 1 or len(charts) >= 6:
            continue
        if key == "peak_mem_bytes":
            values = [v / MIB if v is not None else None for v in values]
        charts.append(Image(f"{key}.png", plots.bars(labels, values, label, label, notes, ref), f"{label} per row"))
    if charts:
        blocks += [Heading("Charts"), *charts]
    if data.figures:
        blocks.append(Heading("Figures written by the benchmark"))
        blocks += [Image(f"bench_{p.name}", _figure(p), p.name) for p in data.figures]
    return title, blocks


def _figure(path: Path) -> bytes:
    """A bench dir's PNG, read as a bounded regular file (the dir is untrusted input)."""
    try:
        return read_bytes(path, 64 << 20)
    except OSError as exc:
        raise ConfigError("RUN_DIR", f"{path}: {exc.strerror or exc}") from None


def report_target(request: ReportRequest) -> Path:
    """Where the report goes (--out, or the dir reported on); refused while another running kiln
    process holds it: a run or bench still being written is its process's."""
    path = Path(request.path)
    target = Path(request.out) if request.out else path.parent if path.is_file() else path
    refuse_held_by_another(target, "--out", "pass --out DIR to write the report elsewhere")
    return target


def make_report(path: str | Path, out: str | Path | None = None) -> dict[str, Path]:
    """Read a run or bench dir and write report.md (+ report_files/) and report.html into `out`
    (default: the dir itself)."""
    data = load(path)
    target = Path(out) if out is not None else data.path
    for name in REPORT_FILES:  # a link where the report goes: refused before any work (exit 2)
        check_target(target / name)
    title, blocks = run_blocks(data) if isinstance(data, RunData) else bench_blocks(data)
    return write_report(blocks, target, title)
