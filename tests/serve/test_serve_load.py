"""benchmarks/serve_load.py's arithmetic: percentiles, the closed-loop ratios, the open-loop
arrivals, rates and the chosen rate, a level's figures, the server-beside-engine table, and one
open-loop level run against a stand-in server (httpx's mock transport)."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest
from tests.benchmark_scripts import load_script


@pytest.fixture(scope="module")
def load():
    return load_script("serve_load")


@pytest.fixture(scope="module")
def report(load):
    return load_script("serve_report")


def test_percentiles_and_closed_loop_ratios(load):
    assert load.pct([], 0.5) is None
    assert load.pct([5.0, 1.0, 3.0, 2.0], 0.5) == 2.0 and load.pct(list(range(1, 101)), 0.99) == 99
    assert load.pct([7.0], 0.99) == 7.0 and load.pct([1.0, 2.0], 0.99) == 2.0
    levels = [{"concurrency": 1, "tokens_per_s": 100.0, "itl_p50_ms": 10.0, "requests_per_s": 1.0, "ttft_p99_ms": 50.0},
              {"concurrency": 8, "tokens_per_s": 700.0, "itl_p50_ms": 12.0, "requests_per_s": 7.0, "ttft_p99_ms": 900.0},
              {"concurrency": 32, "tokens_per_s": 2000.0, "itl_p50_ms": 20.0, "requests_per_s": 20.0,
               "ttft_p99_ms": 1500.0}]
    out = load.with_ratios(levels)
    assert [lv["tokens_per_s_vs_1"] for lv in out["levels"]] == [1.0, 7.0, 20.0]
    assert [lv["itl_p50_vs_1"] for lv in out["levels"]] == [1.0, 1.2, 2.0]
    assert out["requests_per_s_at_p99_ttft_under_1s"] == 7.0


def test_poisson_arrivals_are_the_running_sums_of_exponential_gaps(load):
    times = load.arrival_times(4.0, 3.0, random.Random(7))
    rng, expected, t = random.Random(7), [], 0.0
    while True:
        t += rng.expovariate(4.0)
        if t >= 3.0:
            break
        expected.append(t)
    assert times == expected and times and times == sorted(times) and times[-1] < 3.0
    assert load.arrival_times(1e-6, 1.0, random.Random(0)) == []


def test_open_rates_and_the_chosen_rate(load):
    assert load.open_rates(10.0, [1.25, 0.25, 0.5]) == [2.5, 5.0, 12.5]
    rows = [{"offered_rps": 2.0, "failed": 0, "ttft_p99_ms": 100.0},
            {"offered_rps": 4.0, "failed": 0, "ttft_p99_ms": 999.9},
            {"offered_rps": 6.0, "failed": 1, "ttft_p99_ms": 200.0},   # a failure disqualifies
            {"offered_rps": 8.0, "failed": 0, "ttft_p99_ms": 1000.0},  # at the bar is not under it
            {"offered_rps": 9.0, "failed": 0, "ttft_p99_ms": None}]
    assert load.best_open_rate(rows) == 4.0
    assert load.best_open_rate(rows[2:]) is None and load.best_open_rate([]) is None


def test_a_levels_figures(load):
    done = [{"end": 1.0, "tokens": 3, "ttft": 0.1, "gaps": [0.01, 0.03], "error": None},
            {"end": 2.0, "tokens": 2, "ttft": 0.3, "gaps": [0.02], "error": None},
            {"end": 2.0, "tokens": 0, "ttft": None, "gaps": [], "error": "HTTP 429: full"}]
    s = load.stats(done, 2.0, refused=1)
    assert (s["requests"], s["failed"], s["tokens"]) == (4, 2, 5)
    assert s["errors"] == ["HTTP 429: full", "over --open-max-in-flight"]
    assert s["tokens_per_s"] == 2.5 and s["requests_per_s"] == 1.0
    assert s["ttft_p50_ms"] == 100.0 and s["ttft_p99_ms"] == 300.0
    assert s["itl_p50_ms"] == 20.0 and s["itl_p99_ms"] == 30.0 and s["itl_mean_ms"] == pytest.approx(20.0)


def test_the_server_beside_the_engine_and_the_roofline(report):
    serve = [{"label": "bf16", "quant": "none", "mode": "closed", "concurrency": 1, "itl_p50_ms": 2.5,
              "itl_p50_vs_1": 1.0},
             {"label": "bf16", "quant": "none", "mode": "closed", "concurrency": 32, "itl_p50_ms": 5.0,
              "itl_p50_vs_1": 2.0},
             {"label": "int4", "quant": "int4@triton", "mode": "closed", "concurrency": 8, "itl_p50_ms": 3.0},
             {"label": "bf16", "quant": "none", "mode": "open", "offered_rps": 3.0, "itl_p50_ms": 9.0}]
    engine = [{"quant": "none", "batch": 1, "status": "ok", "decode_step_ms": 2.0, "roofline_tok_s": 500.0},
              {"quant": "none", "batch": 32, "status": "ok", "decode_step_ms": 4.0, "roofline_tok_s": 16000.0},
              {"quant": "int4@triton", "batch": 8, "status": "skipped", "decode_step_ms": None}]
    rows = report.side_by_side(serve, engine)
    assert [(r["label"], r["streams"]) for r in rows] == [("bf16", 1), ("bf16", 32), ("int4", 8)]
    assert rows[0]["engine_step_ms"] == 2.0 and rows[0]["itl_vs_engine_step"] == 1.25
    assert rows[0]["roofline_step_ms"] == 2.0 and rows[0]["itl_vs_roofline"] == 1.25
    assert rows[1]["itl_vs_engine_step"] == 1.25 and rows[1]["roofline_step_ms"] == 2.0
    assert rows[1]["engine_step_vs_b1"] == 2.0
    assert rows[2]["engine_step_ms"] is None and rows[2]["itl_vs_engine_step"] is None  # a skipped row matches none
    old = [{"label": "bf16", "concurrency": 1, "itl_p50_ms": 2.5}]  # results written before `quant` was recorded
    assert report.side_by_side(old, engine)[0]["engine_step_ms"] == 2.0


def test_an_open_loop_level_against_a_stand_in_server(load, monkeypatch):
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        events = [f"data: {json.dumps({'choices': [{'text': f'{i},'}]})}\n\n" for i in range(body["max_tokens"])]
        return httpx.Response(200, text="".join(events) + "data: [DONE]\n\n",
                              headers={"content-type": "text/event-stream"})

    real = httpx.AsyncClient
    monkeypatch.setattr(httpx, "AsyncClient", lambda **kw: real(transport=httpx.MockTransport(handler), **kw))
    args = load.parse_args(["--url", "http://stand-in", "--model", "m", "--prompt-len", "4", "--max-tokens", "3",
                            "--vocab", "100", "--open-duration-s", "0.5", "--open-max-in-flight", "64"])
    args.headers = {}
    row = asyncio.run(load.open_level(httpx, args, 20.0, random.Random(3)))
    arrivals = len(load.arrival_times(20.0, 0.5, random.Random(3)))
    assert row["mode"] == "open" and row["offered_rps"] == 20.0
    assert row["requests"] == arrivals and row["failed"] == 0 and row["tokens"] == 3 * arrivals
    assert row["ttft_p99_ms"] is not None and row["ttft_p99_ms"] >= 0


def test_the_servers_step_and_idle_means_over_a_level(load):
    before = {load.STEP + "_sum": 0.5, load.STEP + "_count": 100.0, load.IDLE + "_sum": 0.1, load.IDLE + "_count": 99.0}
    after = {load.STEP + "_sum": 0.8, load.STEP + "_count": 200.0, load.IDLE + "_sum": 0.2, load.IDLE + "_count": 199.0}
    assert load.server_side(before, after) == pytest.approx(
        {"server_step_ms": 3.0, "server_idle_ms": 1.0, "server_idle_frac": 0.25})
    assert load.server_side({}, {}) == {"server_step_ms": None, "server_idle_ms": None, "server_idle_frac": None}


def test_a_closed_level_reads_the_servers_metrics_around_it(load, monkeypatch):
    scrapes = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":  # 40 more steps of 2 ms and 1 ms idle at each scrape
            n = 40 * len(scrapes)
            scrapes.append(n)
            return httpx.Response(200, text=f"# HELP x\n{load.STEP}_sum {n * 0.002}\n{load.STEP}_count {n}\n"
                                            f"{load.IDLE}_sum {n * 0.001}\n{load.IDLE}_count {n}\nother_sum 5\n")
        events = [f"data: {json.dumps({'choices': [{'text': f'{i},'}]})}\n\n" for i in range(3)]
        return httpx.Response(200, text="".join(events) + "data: [DONE]\n\n", headers={"content-type": "text/event-stream"})

    real = httpx.AsyncClient
    monkeypatch.setattr(httpx, "AsyncClient", lambda **kw: real(transport=httpx.MockTransport(handler), **kw))
    for procs in (1, 2):  # with 2, three clients in two forked processes (2 + 1)
        scrapes.clear()
        args = load.parse_args(["--url", "http://stand-in", "--model", "m", "--prompt-len", "4", "--max-tokens", "3",
                                "--vocab", "100", "--duration-s", "0.3", "--procs", str(procs)])
        args.headers = {}
        row = asyncio.run(load.level(httpx, args, 3, random.Random(3)))
        assert len(scrapes) == 2 and row["tokens"] == 3 * row["requests"] > 0 and row["failed"] == 0
        assert row["server_step_ms"] == pytest.approx(2.0) and row["server_idle_ms"] == pytest.approx(1.0)
        assert row["server_idle_frac"] == pytest.approx(1 / 3) and 0 < row["client_cpu_frac"]
        assert row["wall_s"] >= 0.3 and row["itl_p50_ms"] is not None


def test_a_failed_client_process_fails_the_level_naming_it(load, monkeypatch):
    async def broken(*_args):
        raise ConnectionError("refused")

    monkeypatch.setattr(load, "clients", broken)  # the forked children call it
    monkeypatch.setattr(load, "scrape", lambda *_: asyncio.sleep(0, result={}))
    monkeypatch.setattr(load, "one_request", lambda *_: asyncio.sleep(0, result={}))
    args = load.parse_args(["--url", "http://stand-in", "--model", "m", "--duration-s", "0.1", "--procs", "2"])
    args.headers = {}
    with pytest.raises(RuntimeError, match="client process of the 2-stream level failed: ConnectionError: refused"):
        asyncio.run(load.level(httpx, args, 2, random.Random(0)))


def test_the_text_parts_answer_and_counters_in_the_summary(report, tmp_path):
    text = tmp_path / "text"
    text.mkdir()
    (text / "prompt.txt").write_text("The kernel\n")
    (text / "chat.json").write_text('{"error": {"code": "no_chat_template"}}')
    (text / "answer.json").write_text(json.dumps({"object": "text_completion", "usage": {"completion_tokens": 2},
                                                  "choices": [{"text": " boots", "finish_reason": "length"}]}))
    (text / "metrics.txt").write_text('# HELP x\nkiln_serve_running 0\nkiln_serve_ttft_seconds_bucket{le="0.1"} 1\n')
    out = report.summary(tmp_path)
    assert "Prompt: 'The kernel'" in out and "/v1/completions (chat: no template, so text_completion)" in out
    assert "```\n boots\n```" in out and "kiln_serve_running 0" in out and "_bucket" not in out
    assert "Closed loop" not in out  # no load part run
