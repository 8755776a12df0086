"""kiln serve's pieces without a server: request checks, chat templates, text with stop strings,
the scheduler's admission bound and the metrics text."""

from __future__ import annotations

import pytest
import torch

from kiln.serve.app import TokenEvent, _choice, _sse
from kiln.serve.chat import load_chat_template
from kiln.serve.metrics import Histogram, ServeMetrics
from kiln.serve.protocol import ApiError, parse_body, parse_params
from kiln.serve.rows import Launched, Rows, RowSettings
from kiln.serve.scheduler import Job, QueueFull, Scheduler
from kiln.serve.serve_options import ServeOptions
from kiln.serve.server import check_serve
from kiln.serve.texts import Served, TextStream


def _error(fn, *args) -> ApiError:
    with pytest.raises(ApiError) as err:
        fn(*args)
    return err.value


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "a", "logprobs": 2}, "logprobs"),
    ({"prompt": "a", "temperature": -1}, "temperature"),
    ({"prompt": "a", "top_p": 1.5}, "top_p"),
    ({"prompt": "a", "top_k": 2.5}, "top_k"),
    ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "a", "seed": "x"}, "seed"),
    ({"prompt": "a", "stream": "yes"}, "stream"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
])
def test_a_bad_field_is_named(body, param):
    err = _error(parse_params, body, "completions")
    assert (err.status, err.param) == (400, param)
    assert err.body()["error"]["param"] == param


def test_chat_fields_and_defaults():
    p = parse_params({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                      "max_completion_tokens": 5, "top_k": -1}, "chat")
    assert p.messages == [{"role": "user", "content": "hi"}] and p.max_tokens == 5 and p.top_k == 0
    assert p.temperature == 1.0 and p.stop == () and not p.stream
    assert parse_params({"prompt": "a"}, "completions").max_tokens is None
    assert _error(parse_params, {"messages": [{"role": "user", "content": "x", "tool": 1}]}, "chat").param == \
        "messages[0].tool"
    assert _error(parse_body, b"[1]").code == "invalid_json"


class WordTokenizer:
    """ids are word numbers; decode joins words with spaces (like the test tokenizer.json)."""

    def __init__(self, words):
        self.words = words

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)

    def encode(self, text, special=True):
        return [self.words.index(w) for w in text.split()]


def test_text_stream_holds_back_what_may_become_a_stop_string():
    tok = WordTokenizer(["a", "b", "END", "c"])
    s = TextStream(tok, ("b E",))
    assert s.push(0, False) == "a"
    assert s.push(1, False) == " "  # "a b": " b" could start "b E"... only "b" is held
    assert s.push(2, False) == "" and s.stopped  # "a b END": cut before the stop string
    s = TextStream(tok, ("zz",))
    assert [s.push(t, i == 2) for i, t in enumerate([0, 3, 1])] == ["a", " c", " b"] and not s.stopped


def test_served_refuses_what_does_not_fit(tmp_path):
    tok = WordTokenizer(["a", "b", "c"])
    served = Served("m", tok, None, context=8, vocab_size=3, stop_tokens=frozenset())
    assert _error(served.job, parse_params({"prompt": "a b c", "max_tokens": 6}, "completions")).param == "max_tokens"
    assert _error(served.job, parse_params({"prompt": [0] * 8}, "completions")).param == "prompt"
    assert _error(served.job, parse_params({"prompt": [5]}, "completions")).param == "prompt"
    assert _error(served.job, parse_params({"prompt": "a", "model": "x"}, "completions")).status == 404
    assert _error(served.job, parse_params({"messages": [{"role": "user", "content": "a"}]}, "chat")).code == \
        "no_chat_template"
    job = served.job(parse_params({"prompt": "a b", "seed": 7, "temperature": 0.5}, "completions"))
    assert job.prompt == [0, 1] and job.max_tokens == 6  # OpenAI's 16, or the room left
    chat = Served("m", tok, None, context=32, vocab_size=3, stop_tokens=frozenset())
    assert chat.job(parse_params({"prompt": [0, 1]}, "completions")).max_tokens == 16
    assert job.settings == RowSettings(0.5, 0, 1.0, 7)


def test_chat_template_from_tokenizer_config(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(
        '{"bos_token": {"content": "<s>"}, "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]'
        '{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}'
        '{% if messages|length > 2 %}{{ raise_exception(\'too many\') }}{% endif %}"}')
    template = load_chat_template(tmp_path)
    assert template.render([{"role": "user", "content": "hi"}]) == "<s>[user]hi[assistant]"
    assert _error(template.render, [{"role": "user", "content": "x"}] * 3).code == "chat_template_error"
    assert load_chat_template(tmp_path / "none") is None


class FakeRows:
    rows = 2


def test_admission_bound_is_rows_plus_queue():
    metrics = ServeMetrics("m")
    sched = Scheduler(FakeRows(), max_queue=1, prefill_tokens=64, sink=lambda e: None, metrics=metrics)
    jobs = [Job([1], 1, RowSettings()) for _ in range(4)]
    for j in jobs[:3]:
        sched.submit(j)
    with pytest.raises(QueueFull):
        sched.submit(jobs[3])
    jobs[0].cancel()
    sched._drop_cancelled()
    sched.submit(jobs[3])
    assert sched.load == (3, 0) and metrics.rejected == 1 and metrics.requests == {"cancelled": 1}


def test_histogram_and_metrics_text():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 2.0):
        h.observe(v)
    assert h.lines("x") == ['x_bucket{le="0.1"} 2', 'x_bucket{le="1.0"} 3', 'x_bucket{le="+Inf"} 4',
                            "x_sum 2.65", "x_count 4"]
    t = [0.0]
    m = ServeMetrics("m", clock=lambda: t[0])
    m.generated(30)
    t[0] = 5.0
    m.generated(20)
    assert m.tokens_per_second() == 5.0
    t[0] = 12.0  # the first 30 tokens are out of the 10 s window
    assert m.tokens_per_second() == 2.0
    assert "kiln_serve_generated_tokens_total 50" in m.text()


@pytest.mark.parametrize(("flags", "needles"), [
    (["--model", "nowhere"], ["--model", "nowhere"]),
    (["--model", "llama-tiny", "--max-batch", "0"], ["--max-batch", ">= 1"]),
    (["--model", "llama-tiny", "--max-batch", "8", "--batch-buckets", "1,9"], ["--batch-buckets", "[1, --max-batch=8]"]),
    (["--model", "llama-tiny", "--max-queue", "-1"], ["--max-queue"]),
    (["--model", "llama-tiny", "--port", "70000"], ["--port"]),
    (["--model", "llama-tiny", "--join-batch", "3"], ["--join-batch", "1", "2", "4"]),
    (["--model", "llama-tiny", "--max-seq-len", "999999"], ["--max-seq-len", "positions"]),
    (["--model", "llama-tiny", "--quant", "int3"], ["--quant"]),
    (["--model", "llama-tiny", "--warmup-prompt-buckets", "16,100"], ["--warmup-prompt-buckets", "100", "256"]),
    (["--model", "llama-tiny", "--no-warmup", "--warmup-prompt-buckets", "16"], ["--warmup-prompt-buckets",
                                                                                 "--no-warmup"]),
])
def test_bad_flags_exit_2_naming_the_flag(bad_input, flags, needles):
    bad_input(["serve", "--device", "cpu", *flags], needles)


def test_the_api_key_comes_from_the_flag_or_the_environment(monkeypatch):
    monkeypatch.delenv("KILN_API_KEY", raising=False)
    assert check_serve(ServeOptions(model="llama-tiny", device="cpu")).api_key is None
    monkeypatch.setenv("KILN_API_KEY", "from-env")
    setup = check_serve(ServeOptions(model="llama-tiny", device="cpu"))
    assert setup.api_key == "from-env" and setup.name == "llama-tiny"
    assert setup.context == 256  # the model's positions, under the 2048 default cap
    assert check_serve(ServeOptions(model="llama-tiny", device="cpu", api_key="flag")).api_key == "flag"


@pytest.mark.parametrize("route", ["completions", "chat"])
@pytest.mark.parametrize("text", ["a", " word", 'quote " and \\ backslash', "line\nbreak", "é ✓ 😀", "\x00"])
def test_a_token_event_is_byte_for_byte_the_general_one(route, text):
    params = parse_params({"prompt": "x"} if route == "completions" else {"messages": [{"role": "user",
                                                                                        "content": "x"}]}, route)
    head = {"id": "cmpl-1", "created": 5, "model": "m", "object": "text_completion"}
    assert TokenEvent(head, route)(text) == _sse({**head, "choices": [_choice(params, text, None, False)]})


class TimedRows:
    """Rows whose every call takes `cost` seconds of a fake clock (what the device does)."""

    rows, capacity = 4, 100

    def __init__(self, clock: list[float], cost: float):
        self.clock, self.cost, self.busy = clock, cost, set()

    def _spend(self):
        self.clock[0] += self.cost

    def free_rows(self, n):
        return [r for r in range(self.rows) if r not in self.busy][:n]

    def prefill_sizes(self, bucket):
        return [1]

    def place(self, prompt_len, max_tokens):
        self._spend()
        return True

    def join_many(self, joins):
        self._spend()
        self.busy.update(row for row, *_ in joins)
        return [7] * len(joins)

    def leave(self, row):
        self.busy.discard(row)

    def launch(self):
        self._spend()
        return sorted(self.busy)

    def collect(self, launched):
        self._spend()
        return {r: 7 for r in launched}

    @staticmethod
    def step_times(launched):
        return 0.003, 0.0005


def test_the_host_time_per_iteration_leaves_out_the_rows_calls():
    t = [0.0]

    def sink(events):  # host work inside the iteration: 0.25 s of the fake clock per hand-off
        t[0] += 0.25

    metrics = ServeMetrics("m", clock=lambda: t[0])
    sched = Scheduler(TimedRows(t, 10.0), max_queue=4, prefill_tokens=64, sink=sink, metrics=metrics,
                      clock=lambda: t[0])
    sched.submit(Job([1, 2], 3, RowSettings()))
    sched.iterate()  # admit (place + join) and launch: 30 s of rows, one hand-off
    sched.iterate()  # launch and collect: 20 s of rows, one hand-off
    assert metrics.host.count == 2 and metrics.host.sum == 0.5
    assert "kiln_serve_iteration_host_seconds_count 2" in metrics.text()
    # the collected step's device time and the idle time before it (the first iteration collects none)
    assert (metrics.step.count, metrics.step.sum, metrics.idle.count, metrics.idle.sum) == (1, 0.003, 1, 0.0005)
    text = metrics.text()
    assert 'kiln_serve_decode_step_device_seconds_bucket{le="0.003"} 1' in text
    assert 'kiln_serve_device_idle_before_step_seconds_bucket{le="0.00025"} 0' in text
    assert "kiln_serve_device_idle_before_step_seconds_count 1" in text


class FakeEvent:
    """A CUDA timing event's elapsed_time on a made-up device clock (ms)."""

    def __init__(self, at_ms):
        self.at_ms = at_ms

    def elapsed_time(self, end):
        return end.at_ms - self.at_ms


def test_a_steps_device_time_and_the_idle_before_it():
    def launched(after, start, end):
        return Launched([0], torch.zeros(1), FakeEvent(end), FakeEvent(start), after and FakeEvent(after))
    assert Rows.step_times(launched(10.0, 12.5, 15.5)) == (0.003, 0.0025)
    assert Rows.step_times(launched(10.0, 9.0, 15.0)) == (0.006, 0.0)  # queued before the last work ended
    assert Rows.step_times(launched(None, 1.0, 3.0)) == (0.002, None)  # no work before it
    assert Rows.step_times(Launched([0], torch.zeros(1), None)) is None  # off CUDA


def test_text_stream_decoding_a_few_tokens_at_a_time_gives_the_whole_decode(tmp_path):
    from tokenizers import Tokenizer as Raw
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from kiln.llm.tokenizer import Tokenizer

    raw = Raw(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    corpus = ["the kiln fires clay", "café ✓ naïve 😀 漢字", "  spaced  words\\n\\tand tabs"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()  # every byte a token: any text encodes
    raw.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet))
    raw.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer(tmp_path / "tokenizer.json")
    for text in [*corpus, "😀😀 漢 é", "x✓y"]:  # multi-byte characters split over byte tokens
        ids = raw.encode(text).ids
        stream = TextStream(tok, ())
        parts = [stream.push(t, i == len(ids) - 1) for i, t in enumerate(ids)]
        assert "".join(parts) == raw.decode(ids) == text
        assert all("\ufffd" not in p for p in parts)
