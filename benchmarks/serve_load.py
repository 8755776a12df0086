"""A bounded load generator for `kiln serve` (httpx, async, streaming /v1/completions).

At each concurrency level C, C clients send requests back to back for --duration-s (none starts
after it; each is bounded by --request-timeout-s), every request a random prompt of --prompt-len
token ids and --max-tokens tokens (greedy unless --temperature), streamed. Before a level is timed, C short requests warm
it up (the server compiles each decode batch bucket on its first use). Per level: aggregate
tokens/s (completion tokens over the level's wall time), requests/s, TTFT and inter-token latency
p50/p99 (every gap between two streamed tokens of a request), the level's ratios to the
single-stream level, the server's decode step on the device and the device's idle time before a step
(from its /metrics before and after the level: is a gap the step, or the host starting it late?),
and the share of a core this client used.

Then, with --open-fractions, an open-loop sweep: requests arrive as a Poisson process at each rate
(the fractions times the requests/s of the closed-loop level --open-base, e.g. 0.25x .. 1.5x the
32-stream rate), whatever the server's pace, for --open-duration-s, at most --open-max-in-flight at
once (an arrival beyond it is refused: counted as failed). TTFT counts from the scheduled arrival,
so a server that falls behind shows it. The sweep stops after the first rate whose p99 TTFT
reaches 1 s; "requests/s at p99 TTFT < 1 s" is the highest offered rate with no failure and a p99
TTFT under 1 s. --deadline-s: no level or rate starts unless its duration and a margin fit.

    python benchmarks/serve_load.py --url http://127.0.0.1:8011 --label bf16 --out DIR/serve_bf16 \
        --open-fractions 0.25,0.5,0.75,1,1.25,1.5
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
import multiprocessing
import random
import statistics
import sys
import time
from pathlib import Path
from queue import Empty

from kiln.bench.results import refuse_held_results, write_results
from kiln.monitor.env import collect_env

sys.path.insert(0, str(Path(__file__).parent))
from serve_report import COLUMNS, OPEN_COLUMNS, markdown, summary  # noqa: E402  (a sibling script)

BAR_MS = 1000.0
"""The p99 TTFT bar of the open-loop sweep."""


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def arrival_times(rate: float, duration: float, rng: random.Random) -> list[float]:
    """Seconds after the start at which requests arrive: a Poisson process of `rate` per second
    (exponential gaps), every arrival before `duration`."""
    times, t = [], rng.expovariate(rate)
    while t < duration:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def open_rates(base: float, fractions: list[float]) -> list[float]:
    """The offered rates of the sweep: `fractions` of `base` requests/s, ascending."""
    return sorted(base * f for f in fractions)


def best_open_rate(rows: list[dict], bar_ms: float = BAR_MS) -> float | None:
    """The highest offered rate with no failed request and a p99 TTFT under `bar_ms`."""
    fine = [r["offered_rps"] for r in rows if not r["failed"] and r["ttft_p99_ms"] is not None
            and r["ttft_p99_ms"] < bar_ms]
    return max(fine) if fine else None


async def one_request(client, url: str, body: dict, timeout: float, sent: float | None = None) -> dict:
    """One streamed request; TTFT counts from `sent` (the scheduled arrival; default: now)."""
    sent = time.perf_counter() if sent is None else sent
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
    return {"model": args.model, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": args.temperature,
            "top_p": args.top_p, "stream": True}


def stats(done: list[dict], wall: float, refused: int = 0) -> dict:
    """A level's figures from its requests (`refused`: arrivals never sent, counted as failed)."""
    ok = [r for r in done if r["error"] is None]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    gaps = [g for r in ok for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in ok)
    errors = {r["error"] for r in done if r["error"]} | ({"over --open-max-in-flight"} if refused else set())
    return {"requests": len(done) + refused, "failed": len(done) - len(ok) + refused, "errors": sorted(errors)[:3],
            "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall if wall > 0 else None,
            "requests_per_s": len(ok) / wall if wall > 0 else None,
            "ttft_p50_ms": _ms(pct(ttft, 0.5)), "ttft_p99_ms": _ms(pct(ttft, 0.99)),
            "itl_p50_ms": _ms(pct(gaps, 0.5)), "itl_p99_ms": _ms(pct(gaps, 0.99)),
            "itl_mean_ms": _ms(statistics.fmean(gaps) if gaps else None)}


def _client(httpx, args, connections: int):
    limits = httpx.Limits(max_connections=connections + 4, max_keepalive_connections=connections + 4)
    return httpx.AsyncClient(limits=limits, headers=args.headers)


STEP, IDLE = "kiln_serve_decode_step_device_seconds", "kiln_serve_device_idle_before_step_seconds"
"""The server's histograms of a decode step's device time and of the device's idle time before it."""


async def scrape(client, args) -> dict[str, float]:
    """The `_sum` and `_count` samples of the server's /metrics (none when it cannot be read)."""
    try:
        text = (await client.get(args.url + "/metrics", timeout=10)).text
    except Exception:  # a server without /metrics: the level's own figures stand alone
        return {}
    pairs = (line.split(" ", 1) for line in text.splitlines() if line.startswith("kiln_serve_"))
    return {k: float(v) for k, v in pairs if k.endswith(("_sum", "_count"))}


def server_side(before: dict[str, float], after: dict[str, float]) -> dict:
    """A level's server-side means from scrapes before and after it: the decode step's device ms,
    the device's idle ms before a step (the host starting it late), and the idle share of both."""
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)
    steps, idles, step_s, idle_s = delta(STEP + "_count"), delta(IDLE + "_count"), delta(STEP + "_sum"), delta(IDLE + "_sum")
    return {"server_step_ms": step_s / steps * 1e3 if steps else None,
            "server_idle_ms": idle_s / idles * 1e3 if idles else None,
            "server_idle_frac": idle_s / (idle_s + step_s) if steps and idles and idle_s + step_s > 0 else None}


async def level(httpx, args, c: int, rng: random.Random) -> dict:
    """Closed loop: `c` clients, each sending its next request when the last one ends (spread over
    --procs processes). Also the server's step and idle means over the level, and the largest share
    of a core a client process used (near 1: its own pace may stretch the gaps it measures)."""
    async with _client(httpx, args, c) as client:
        warm = [{**body_for(rng, args), "max_tokens": 4} for _ in range(c)]
        await asyncio.gather(*[one_request(client, args.url, b, args.request_timeout_s) for b in warm])
        before = await scrape(client, args)
        n = max(1, min(args.procs, c))
        start = time.perf_counter() + (PROCS_START_S if n > 1 else 0.0)
        if n == 1:
            done, busy = await clients(httpx, args, c, rng, start)
            shares = [busy]
        else:  # forked: the children share this process's imports, and perf_counter's clock
            ctx = multiprocessing.get_context("fork")
            queue = ctx.Queue()
            sizes = [c // n + (i < c % n) for i in range(n)]
            procs = [ctx.Process(target=_clients_process, args=(httpx, args, k, rng.randrange(1 << 31), start, queue))
                     for k in sizes]
            for proc in procs:
                proc.start()
            try:  # a child that failed says so, one that hangs runs past its requests' timeout
                parts = [queue.get(timeout=PROCS_START_S + args.duration_s + args.request_timeout_s + 30) for _ in procs]
            except Empty:
                parts = [("error", "no result within the level's time and its requests' timeout")]
            for proc in procs:
                proc.join(timeout=5)
                if proc.is_alive():
                    proc.terminate()
            failed = [detail for status, detail in parts if status == "error"]
            if failed:
                raise RuntimeError(f"serve_load: a client process of the {c}-stream level failed: {failed[0]}")
            done = [r for _, (part, _) in parts for r in part]
            shares = [busy for _, (_, busy) in parts]
        wall = max(r["end"] for r in done) - start
        server = server_side(before, await scrape(client, args))
    return {"mode": "closed", "concurrency": c, **stats(done, wall), **server,
            "client_cpu_frac": max(shares) / wall}


PROCS_START_S = 1.0
"""With --procs, the level starts this long after the processes are forked (they start first)."""


async def clients(httpx, args, c: int, rng: random.Random, start: float) -> tuple[list[dict], float]:
    """`c` closed-loop clients from `start` (perf_counter) for --duration-s: their requests, and the
    CPU seconds this process spent meanwhile."""
    async with _client(httpx, args, c) as client:
        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        cpu = time.process_time()
        done: list[dict] = []

        async def worker():
            while time.perf_counter() < start + args.duration_s:
                done.append(await one_request(client, args.url, body_for(rng, args), args.request_timeout_s))
        await asyncio.gather(*[worker() for _ in range(c)])
        return done, time.process_time() - cpu


def _clients_process(httpx, args, c: int, seed: int, start: float, queue) -> None:
    """A forked process's share of a closed level: `clients` on its own event loop, put on `queue`
    as ("ok", result), or ("error", what failed)."""
    try:
        queue.put(("ok", asyncio.run(clients(httpx, args, c, random.Random(seed), start))))
    except BaseException as exc:  # the parent waits for every child: tell it, whatever went wrong
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


async def open_level(httpx, args, rate: float, rng: random.Random) -> dict:
    """Open loop: Poisson arrivals at `rate` per second for --open-duration-s, whatever the server's
    pace; at most --open-max-in-flight at once (an arrival beyond it is refused and counted)."""
    times = arrival_times(rate, args.open_duration_s, rng)
    bodies = [body_for(rng, args) for _ in times]
    done: list[dict] = []
    refused = 0
    in_flight = 0
    async with _client(httpx, args, args.open_max_in_flight) as client:
        start = time.perf_counter()

        async def send(at: float, body: dict):
            nonlocal in_flight
            done.append(await one_request(client, args.url, body, args.request_timeout_s, sent=at))
            in_flight -= 1
        tasks = []
        for t, body in zip(times, bodies):
            await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
            if in_flight >= args.open_max_in_flight:
                refused += 1
                continue
            in_flight += 1
            tasks.append(asyncio.create_task(send(start + t, body)))
        await asyncio.gather(*tasks)
        wall = max([args.open_duration_s, *(r["end"] - start for r in done)])
    return {"mode": "open", "offered_rps": rate, **stats(done, wall, refused)}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def with_ratios(levels: list[dict]) -> dict:
    one = next((lv for lv in levels if lv["concurrency"] == 1), None)
    for lv in levels:
        if one and one["tokens_per_s"] and one["itl_p50_ms"] and lv["itl_p50_ms"]:
            lv["tokens_per_s_vs_1"] = lv["tokens_per_s"] / one["tokens_per_s"]
            lv["itl_p50_vs_1"] = lv["itl_p50_ms"] / one["itl_p50_ms"]
    under = [lv["requests_per_s"] for lv in levels if lv["ttft_p99_ms"] is not None and lv["ttft_p99_ms"] < BAR_MS]
    return {"levels": levels, "requests_per_s_at_p99_ttft_under_1s": max(under) if under else None}


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8011")
    p.add_argument("--model", default=None, help="the served model id (default: the server's /v1/models)")
    p.add_argument("--label", default="serve")
    p.add_argument("--quant", default="none", help="the server's --quant, recorded to match `kiln bench llm` rows")
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="every request's temperature (default 0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="every request's top_p (default 1: off)")
    p.add_argument("--vocab", type=int, default=128256, help="prompt token ids are drawn below this")
    p.add_argument("--duration-s", type=float, default=20.0, help="seconds each level sends requests")
    p.add_argument("--procs", type=int, default=1, help="client processes a closed level's streams are spread "
                   "over, each on its own event loop, so that one client's pace does not stretch the gaps it "
                   "measures (default 1)")
    p.add_argument("--request-timeout-s", type=float, default=300.0)
    p.add_argument("--open-fractions", type=_floats, default=[], help="open-loop rates as fractions of the "
                   "--open-base level's requests/s, comma-separated (default: no open-loop sweep)")
    p.add_argument("--open-base", type=int, default=32, help="the closed-loop concurrency whose requests/s the "
                   "fractions scale (default 32; the highest level run if absent)")
    p.add_argument("--open-duration-s", type=float, default=10.0, help="seconds of arrivals per open-loop rate")
    p.add_argument("--open-max-in-flight", type=int, default=128, help="open-loop requests in flight at most")
    p.add_argument("--deadline-s", type=float, default=None, help="start no level or rate after this many seconds "
                   "from the start unless it fits (duration + 30 s margin)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="results directory (results.json, results.md); must hold no results")
    p.add_argument("--summary", default=None, metavar="DIR", help="only write DIR/summary.md from earlier runs")
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
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
    t0 = time.monotonic()

    def fits(seconds: float) -> bool:
        return args.deadline_s is None or time.monotonic() - t0 + seconds + 30 <= args.deadline_s
    args.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if args.model is None:
        args.model = httpx.get(args.url + "/v1/models", headers=args.headers).json()["data"][0]["id"]
    rng = random.Random(args.seed)
    levels, skipped = [], []
    for c in (int(x) for x in args.concurrency.split(",")):
        if not fits(args.duration_s):
            skipped.append(f"{c} streams")
            continue
        lv = asyncio.run(level(httpx, args, c, rng))
        print(json.dumps(lv), flush=True)
        levels.append(lv)
    ratios = with_ratios(levels)
    opens = []
    if args.open_fractions and levels:
        base_level = next((lv for lv in levels if lv["concurrency"] == args.open_base), levels[-1])
        for rate in open_rates(base_level["requests_per_s"] or 0.0, args.open_fractions):
            if rate <= 0 or not fits(args.open_duration_s):
                skipped.append(f"{rate:.3g} requests/s")
                continue
            row = asyncio.run(open_level(httpx, args, rate, rng))
            print(json.dumps(row), flush=True)
            opens.append(row)
            if row["failed"] or row["ttft_p99_ms"] is None or row["ttft_p99_ms"] >= BAR_MS:
                break  # higher rates only queue more
    rows = [{"label": args.label, "quant": args.quant, "status": "ok" if lv["requests"] > lv["failed"] else "error",
             "reason": "; ".join(lv["errors"]) or None, **lv} for lv in [*ratios["levels"], *opens]]
    config = {"label": args.label, "quant": args.quant, "url": args.url, "model": args.model,
              "prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "duration_s": args.duration_s,
              "requests_per_s_at_p99_ttft_under_1s": ratios["requests_per_s_at_p99_ttft_under_1s"],
              "open_fractions": args.open_fractions, "open_duration_s": args.open_duration_s,
              "open_max_in_flight": args.open_max_in_flight,
              "open_rate_at_p99_ttft_under_1s": best_open_rate(opens), "skipped": skipped}
    closed_rows = [r for r in rows if r["mode"] == "closed"]
    open_rows = [r for r in rows if r["mode"] == "open"]
    if args.out:
        sections = [("Closed loop", closed_rows, COLUMNS)] + ([("Open loop", open_rows, OPEN_COLUMNS)] if open_rows else [])
        write_results(args.out, env=collect_env(), config=config, results=rows, columns=COLUMNS,
                      title=f"kiln serve under load: {args.label}", command="python " + " ".join(sys.argv),
                      sections=sections, notes=f"Skipped for the deadline: {', '.join(skipped)}." if skipped else "")
    print(markdown(closed_rows, COLUMNS))
    if open_rows:
        print(markdown(open_rows, OPEN_COLUMNS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
