"""A bounded load generator for `kiln serve` (httpx, async, streaming /v1/completions).

At each concurrency level C, C clients send requests back to back for --duration-s (none starts
after it; each is bounded by --request-timeout-s), every request a random prompt of --prompt-len
token ids and --max-tokens greedy tokens, streamed. Before a level is timed, C short requests warm
it up (the server compiles each decode batch bucket on its first use). Per level: aggregate
tokens/s (completion tokens over the level's wall time), requests/s, TTFT and inter-token latency
p50/p99 (every gap between two streamed tokens of a request), and the level's ratios to the
single-stream level. "Requests/s at p99 TTFT < 1 s" is the best requests/s of the levels whose p99
TTFT stays under 1 s (closed-loop levels, not an open-loop arrival sweep).

    python benchmarks/serve_load.py --url http://127.0.0.1:8011 --label bf16 --out DIR/serve_bf16
    python benchmarks/serve_load.py --summary DIR     # DIR/summary.md: every DIR/serve_*/results.json, and
                                                      # the `kiln bench llm` rows of DIR/generate/results.json
The timestamps are the client's wall clock on purpose: TTFT and inter-token latency are what a
client sees, HTTP and scheduling included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

from kiln.bench.results import refuse_held_results, write_results
from kiln.monitor.env import collect_env


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def one_request(client, url: str, body: dict, timeout: float) -> dict:
    sent = time.perf_counter()
    stamps: list[float] = []
    error = None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body, timeout=timeout) as r:
            if r.status_code != 200:
                error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            else:
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("error"):
                        error = chunk["error"].get("message")
                    elif chunk.get("choices") and chunk["choices"][0].get("text"):
                        stamps.append(time.perf_counter())
    except Exception as exc:  # a timeout or a dropped connection is a failed request, counted
        error = f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    return {"sent": sent, "end": end, "tokens": len(stamps), "ttft": stamps[0] - sent if stamps else None,
            "gaps": [b - a for a, b in zip(stamps, stamps[1:])], "error": error}


def body_for(rng: random.Random, args) -> dict:
    prompt = [rng.randrange(min(1000, args.vocab // 2), args.vocab) for _ in range(args.prompt_len)]
    return {"model": args.model, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0, "stream": True}


async def level(httpx, args, c: int, rng: random.Random) -> dict:
    limits = httpx.Limits(max_connections=c + 4, max_keepalive_connections=c + 4)
    async with httpx.AsyncClient(limits=limits, headers=args.headers) as client:
        warm = [{**body_for(rng, args), "max_tokens": 4} for _ in range(c)]
        await asyncio.gather(*[one_request(client, args.url, b, args.request_timeout_s) for b in warm])
        start = time.perf_counter()
        stop_at = start + args.duration_s
        done: list[dict] = []

        async def worker():
            while time.perf_counter() < stop_at:
                done.append(await one_request(client, args.url, body_for(rng, args), args.request_timeout_s))
        await asyncio.gather(*[worker() for _ in range(c)])
        wall = max(r["end"] for r in done) - start
    ok = [r for r in done if r["error"] is None]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    gaps = [g for r in ok for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in ok)
    return {"concurrency": c, "requests": len(done), "failed": len(done) - len(ok),
            "errors": sorted({r["error"] for r in done if r["error"]})[:3], "wall_s": wall,
            "tokens": tokens, "tokens_per_s": tokens / wall, "requests_per_s": len(ok) / wall,
            "ttft_p50_ms": _ms(pct(ttft, 0.5)), "ttft_p99_ms": _ms(pct(ttft, 0.99)),
            "itl_p50_ms": _ms(pct(gaps, 0.5)), "itl_p99_ms": _ms(pct(gaps, 0.99)),
            "itl_mean_ms": _ms(statistics.fmean(gaps) if gaps else None)}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def with_ratios(levels: list[dict]) -> dict:
    one = next((lv for lv in levels if lv["concurrency"] == 1), None)
    for lv in levels:
        if one and one["tokens_per_s"] and one["itl_p50_ms"] and lv["itl_p50_ms"]:
            lv["tokens_per_s_vs_1"] = lv["tokens_per_s"] / one["tokens_per_s"]
            lv["itl_p50_vs_1"] = lv["itl_p50_ms"] / one["itl_p50_ms"]
    under = [lv["requests_per_s"] for lv in levels if lv["ttft_p99_ms"] is not None and lv["ttft_p99_ms"] < 1000]
    return {"levels": levels, "requests_per_s_at_p99_ttft_under_1s": max(under) if under else None}


COLUMNS = ["label", "concurrency", "requests", "failed", "tokens_per_s", "tokens_per_s_vs_1", "requests_per_s",
           "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "itl_p50_vs_1"]


def _cell(v) -> str:
    return "—" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def markdown(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def summary(directory: Path) -> str:
    out = ["# kiln serve under load\n"]
    rows = []
    for path in sorted(directory.glob("serve_*/results.json")):
        data = json.loads(path.read_text())
        rows += data["results"]
        best = data["config"].get("requests_per_s_at_p99_ttft_under_1s")
        out.append(f"- {data['config']['label']}: requests/s at p99 TTFT < 1 s: {_cell(best)}")
    out += ["", markdown(rows, COLUMNS)]
    gen = directory / "generate" / "results.json"
    if gen.is_file():
        keep = ["label", "quant", "batch", "status", "ttft_ms", "decode_tok_s", "decode_tok_s_per_seq", "decode_step_ms",
                "token_ms_p50", "token_ms_p90", "roofline_frac", "request_tok_s"]
        out += ["`kiln bench llm` (kiln generate's engine, one static batch per row):", "",
                markdown(json.loads(gen.read_text())["results"], keep)]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8011")
    p.add_argument("--model", default=None, help="the served model id (default: the server's /v1/models)")
    p.add_argument("--label", default="serve")
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--vocab", type=int, default=128256, help="prompt token ids are drawn below this")
    p.add_argument("--duration-s", type=float, default=20.0, help="seconds each level sends requests")
    p.add_argument("--request-timeout-s", type=float, default=300.0)
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="results directory (results.json, results.md); must hold no results")
    p.add_argument("--summary", default=None, metavar="DIR", help="only write DIR/summary.md from earlier runs")
    args = p.parse_args()
    if args.summary:
        text = summary(Path(args.summary))
        (Path(args.summary) / "summary.md").write_text(text)
        print(text)
        return 0
    try:
        import httpx
    except ImportError:
        print("serve_load.py needs httpx (pip install httpx)", file=sys.stderr)
        return 2
    if args.out:
        refuse_held_results(Path(args.out))
    args.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if args.model is None:
        args.model = httpx.get(args.url + "/v1/models", headers=args.headers).json()["data"][0]["id"]
    rng = random.Random(args.seed)
    levels = []
    for c in (int(x) for x in args.concurrency.split(",")):
        lv = asyncio.run(level(httpx, args, c, rng))
        print(json.dumps(lv), flush=True)
        levels.append(lv)
    ratios = with_ratios(levels)
    rows = [{"label": args.label, "status": "ok" if lv["requests"] > lv["failed"] else "error",
             "reason": "; ".join(lv["errors"]) or None, **lv} for lv in ratios["levels"]]
    config = {"label": args.label, "url": args.url, "model": args.model, "prompt_len": args.prompt_len,
              "max_tokens": args.max_tokens, "duration_s": args.duration_s,
              "requests_per_s_at_p99_ttft_under_1s": ratios["requests_per_s_at_p99_ttft_under_1s"]}
    if args.out:
        write_results(args.out, env=collect_env(), config=config, results=rows, columns=COLUMNS,
                      title=f"kiln serve under load: {args.label}", command="python " + " ".join(sys.argv))
    print(markdown(rows, COLUMNS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
