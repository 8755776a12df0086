"""`kiln serve` as a real process on a loopback port, queried with the `openai` client: completions
and chat, streaming and not, concurrent requests each getting the tokens they get alone (greedy), a
client leaving mid-stream, a full server's 429, bad requests' 400 naming the field, the API key's
401, and SIGTERM draining to exit 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# openai, httpx (the `test` extra), fastapi and uvicorn (`serve`) are imported without a skip: the
# README's test command installs both extras, and a missing one must fail rather than hide the tests.
import httpx
import openai
import pytest
import torch
from tests.llm.conftest import write_checkpoint, write_tokenizer

from kiln.llm import Engine, build_decoder, resolve_model
from kiln.llm.tokenizer import load_tokenizer

KEY = "test-key"
TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w0{% endif %}"
SRC = Path(__file__).resolve().parents[2] / "src"
LONG = 2048


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = write_checkpoint(tmp_path_factory.mktemp("serve") / "tiny", "llama3-tied")
    write_tokenizer(d)
    # No stop token: every answer runs to max_tokens, so lengths (and so timings) are known.
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": []}))
    # 2048 slots per row (the server's default cap): a stream asked for 2,000 tokens is still running
    # when its client leaves, however loaded the machine is.
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "max_position_embeddings": LONG}))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                         "chat_template": TEMPLATE}))
    return d


def start(model_dir: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    env.pop("KILN_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "kiln", "serve", "--model", str(model_dir), "--device", "cpu",
                             "--port", str(port), "--max-batch", "2", "--max-queue", "1", *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"kiln serve exited {proc.returncode}: {proc.stderr.read()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("kiln serve did not answer /health within 90 s")


@pytest.fixture(scope="module")
def server(model_dir):
    proc, url = start(model_dir, "--api-key", KEY)
    yield url, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def alone(model_dir):
    model = build_decoder(resolve_model(str(model_dir)), device="cpu", dtype=torch.float32)
    tok = load_tokenizer(model_dir)

    def run(prompt: list[int], n: int) -> str:
        return tok.decode(Engine(model).generate([prompt], max_new_tokens=n).tokens[0])
    run.encode = tok.encode
    return run


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    health = httpx.get(server[0] + "/health").json()
    assert health["status"] == "ok" and health["warmup_s"] > 0  # warmed before binding (the default)
    text = httpx.get(server[0] + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    for name in ("kiln_serve_queue_depth", "kiln_serve_running", "kiln_serve_ttft_seconds_bucket",
                 "kiln_serve_inter_token_seconds_count", "kiln_serve_tokens_per_second", "kiln_serve_warmup_seconds"):
        assert name in text


def test_completion_streamed_and_not_equals_the_prompt_alone(client, alone):
    ids = [1, 17, 33, 8]
    out = client.completions.create(model="tiny", prompt=ids, max_tokens=9, temperature=0)
    assert out.choices[0].text == alone(ids, 9) and out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (4, 9)
    chunks = list(client.completions.create(model="tiny", prompt="w5 w6 w7", max_tokens=7, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == alone(alone.encode("w5 w6 w7"), 7)
    assert chunks[-1].usage.completion_tokens == 7 and chunks[-2].choices[0].finish_reason == "length"


def test_chat_uses_the_models_template(client, alone):
    messages = [{"role": "user", "content": "w3 w4"}, {"role": "assistant", "content": "w9"}]
    want = alone(alone.encode("<s>w3 w4 w9 w0"), 6)
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    assert out.choices[0].message.content == want and out.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == want


def test_stop_string_ends_the_answer(client, alone):
    full = alone([1, 17, 33, 8], 9)
    cut = full.split(" ")[3]
    out = client.completions.create(model="tiny", prompt=[1, 17, 33, 8], max_tokens=9, temperature=0, stop=[cut])
    assert out.choices[0].text == full[: full.index(cut)] and out.choices[0].finish_reason == "stop"


def test_concurrent_requests_each_get_their_tokens_alone(client, alone):
    prompts = [[1, 17, 33, 8, 54], [1, 40, 41], [1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]]
    lengths = [12, 5, 9]

    def ask(i):
        return client.completions.create(model="tiny", prompt=prompts[i], max_tokens=lengths[i], temperature=0)
    with ThreadPoolExecutor(3) as pool:  # 2 rows, 1 queued: all three admitted
        got = [r.choices[0].text for r in pool.map(ask, range(3))]
    assert got == [alone(p, n) for p, n in zip(prompts, lengths)]


def _metric(url: str, line: str) -> float:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return next((float(t.rsplit(" ", 1)[1]) for t in text.splitlines() if t.startswith(line + " ")), 0.0)


def test_full_server_says_429_and_a_client_leaving_frees_its_row(server, client):
    url = server[0]
    cancelled = _metric(url, 'kiln_serve_requests_total{reason="cancelled"}')
    streams = [client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=LONG - 48, temperature=0,
                                         stream=True)
               for _ in range(2)]
    for s in streams:
        next(iter(s))  # both rows busy
    queued = threading.Thread(target=lambda: client.completions.create(model="tiny", prompt=[1, 4], max_tokens=3))
    queued.start()
    deadline = time.monotonic() + 10
    while httpx.get(url + "/health").json()["queued"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(openai.RateLimitError) as err:
        client.completions.create(model="tiny", prompt=[1, 5], max_tokens=3)
    assert err.value.body["code"] == "queue_full"
    for s in streams:
        s.close()
    queued.join(20)
    assert not queued.is_alive()
    deadline = time.monotonic() + 10
    while _metric(url, 'kiln_serve_requests_total{reason="cancelled"}') < cancelled + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _metric(url, 'kiln_serve_requests_total{reason="cancelled"}') == cancelled + 2
    assert httpx.get(url + "/health").json()["running"] == 0


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "w1", "bogus": 1}, "bogus"),
    ({"prompt": "w1", "temperature": 5}, "temperature"),
    ({"prompt": "w1", "max_tokens": LONG + 1}, "max_tokens"),
    ({"prompt": [1] * (LONG + 1)}, "prompt"),
    ({"prompt": "w1", "n": 2}, "n"),
    ({"prompt": "w1", "stop": 3}, "stop"),
])
def test_bad_requests_get_400_naming_the_field(client, body, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", **{k: v for k, v in body.items() if k != "bogus"},
                                  extra_body={k: v for k, v in body.items() if k == "bogus"})
    assert err.value.body["param"] == param and err.value.body["message"]


def test_bad_json_and_the_api_key(server):
    url = server[0]
    r = httpx.post(url + "/v1/completions", content=b'{"prompt": ', headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert httpx.get(url + "/v1/models").status_code == 401
    r = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(url + "/health").status_code == 200


def test_sigterm_drains_in_flight_requests_and_exits_0(server):
    url, proc = server
    got = []

    def stream():
        with httpx.stream("POST", url + "/v1/completions", timeout=30, headers={"Authorization": f"Bearer {KEY}"},
                          json={"prompt": [1, 2], "max_tokens": 40, "temperature": 0, "stream": True}) as r:
            got.extend(line for line in r.iter_lines() if line.startswith("data:"))
    t = threading.Thread(target=stream)
    t.start()
    deadline = time.monotonic() + 10
    while httpx.get(url + "/health").json()["running"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    t.join(10)
    assert got[-1] == "data: [DONE]" and len(got) == 41
    assert "stopped on SIGTERM" in proc.stderr.read()
