"""The tables of benchmarks/serve_load.py: a load's closed- and open-loop levels, the server's
inter-token p50 beside `kiln bench llm`'s decode step and the bandwidth roofline, and the summary of
a serve.sh run (`serve_load.py --summary DIR`) with its real-text part."""

from __future__ import annotations

import json
from pathlib import Path

COLUMNS = ["label", "concurrency", "requests", "failed", "tokens_per_s", "tokens_per_s_vs_1", "requests_per_s",
           "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "itl_p50_vs_1", "server_step_ms", "server_idle_ms",
           "client_cpu_frac"]
OPEN_COLUMNS = ["label", "offered_rps", "requests", "failed", "requests_per_s", "tokens_per_s", "ttft_p50_ms",
                "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"]
SIDE_COLUMNS = ["label", "streams", "itl_p50_ms", "itl_p50_vs_1", "engine_step_ms", "itl_vs_engine_step",
                "roofline_step_ms", "itl_vs_roofline", "engine_step_vs_b1"]


def _cell(v) -> str:
    return "—" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def markdown(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def side_by_side(serve_rows: list[dict], engine_rows: list[dict]) -> list[dict]:
    """Each closed-loop server level beside `kiln bench llm`'s row of the same quantization and
    batch: the server's inter-token p50, the engine's decode step, the bandwidth roofline's step
    (batch / roofline tokens/s), and their ratios."""
    engine = {(r.get("quant"), r.get("batch")): r for r in engine_rows if r.get("status") == "ok"}
    out = []
    for r in serve_rows:
        if r.get("mode", "closed") != "closed":
            continue
        quant = r.get("quant") or ("none" if str(r.get("label")).startswith("bf16") else None)
        e = engine.get((quant, r["concurrency"]), {})
        b1 = engine.get((quant, 1), {})
        step = e.get("decode_step_ms")
        roof = r["concurrency"] * 1e3 / e["roofline_tok_s"] if e.get("roofline_tok_s") else None
        out.append({"label": r.get("label"), "streams": r["concurrency"], "itl_p50_ms": r.get("itl_p50_ms"),
                    "itl_p50_vs_1": r.get("itl_p50_vs_1"), "engine_step_ms": step,
                    "itl_vs_engine_step": _ratio(r.get("itl_p50_ms"), step), "roofline_step_ms": roof,
                    "itl_vs_roofline": _ratio(r.get("itl_p50_ms"), roof),
                    "engine_step_vs_b1": _ratio(step, b1.get("decode_step_ms"))})
    return out


def summary(directory: Path) -> str:
    out = ["# kiln serve under load\n"]
    rows, opens = [], []
    for path in sorted(directory.glob("serve_*/results.json")):
        data = json.loads(path.read_text())
        rows += [r for r in data["results"] if r.get("mode", "closed") == "closed"]
        opens += [r for r in data["results"] if r.get("mode") == "open"]
        cfg = data["config"]
        out.append(f"- {cfg['label']}: requests/s at p99 TTFT < 1 s: open loop (Poisson arrivals) "
                   f"{_cell(cfg.get('open_rate_at_p99_ttft_under_1s'))}; best closed-loop level "
                   f"{_cell(cfg.get('requests_per_s_at_p99_ttft_under_1s'))}")
    if rows:
        out += ["", "Closed loop (N clients, each sends its next request when the last one ends):", "",
                markdown(rows, COLUMNS)]
    if opens:
        out += ["Open loop (Poisson arrivals at the offered rate; TTFT from the scheduled arrival):", "",
                markdown(opens, OPEN_COLUMNS)]
    gen = directory / "generate" / "results.json"
    if gen.is_file():
        engine = json.loads(gen.read_text())["results"]
        out += ["The server's inter-token p50 beside the engine's decode step at the same batch "
                "(`kiln bench llm`, same quantization) and the bandwidth roofline's step:", "",
                markdown(side_by_side(rows, engine), SIDE_COLUMNS),
                "The roofline's bytes per step: the weights and the keys and values the requests attend "
                "(kiln.bench.formulas.kv_bytes_per_step). The engine's cache holds prompt + answer slots; the "
                "server's rows hold --max-seq-len slots, of which its decode attention (triton, flash) reads those "
                "each row uses (matmul reads all of them).", ""]
        keep = ["label", "quant", "batch", "status", "ttft_ms", "decode_tok_s", "decode_tok_s_per_seq", "decode_step_ms",
                "token_ms_p50", "token_ms_p90", "roofline_frac", "request_tok_s"]
        out += ["`kiln bench llm` (kiln generate's engine, one static batch per row):", "", markdown(engine, keep)]
    out += text_section(directory / "text")
    return "\n".join(out)


def text_section(directory: Path) -> list[str]:
    """serve.sh's text part, if run: the real-text model's answer and the server's counters."""
    answer = directory / "answer.json"
    if not answer.is_file():
        return []
    try:
        body = json.loads(answer.read_text())
    except ValueError:
        return ["## The real-text model served", "", f"answer.json is not JSON: {answer.read_text()[:300]!r}", ""]
    choice = (body.get("choices") or [{}])[0]
    text = choice.get("text", (choice.get("message") or {}).get("content"))
    route = "/v1/completions" if "text" in choice else "/v1/chat/completions"
    prompt = directory / "prompt.txt"
    lines = ["## The real-text model served", ""]
    if prompt.is_file():
        lines += [f"Prompt: {prompt.read_text().strip()!r}", ""]
    lines += [f"{route} ({'chat: no template, so ' if (directory / 'chat.json').is_file() else ''}"
             f"{body.get('object', '?')}), finish `{choice.get('finish_reason')}`, usage {body.get('usage')}:", "",
             "```", str(text if text is not None else body), "```", ""]
    metrics = directory / "metrics.txt"
    if metrics.is_file():
        keep = [ln for ln in metrics.read_text().splitlines() if ln.startswith("kiln_serve_") and "_bucket{" not in ln]
        lines += ["`/metrics` after it (histogram buckets left out):", "", "```", *keep, "```", ""]
    return lines
