"""Joins prefilled together: each request of a batch of joins (different prompt lengths, one
bucket) gets exactly its tokens alone (greedy) and its own sampling; the scheduler groups the head
of the queue with the requests behind it in its bucket, within the prefill budget."""

from __future__ import annotations

import pytest

from kiln.llm import Engine
from kiln.serve.join_prefill import prefill_sizes, split_sizes
from kiln.serve.metrics import ServeMetrics
from kiln.serve.rows import Rows, RowSettings
from kiln.serve.scheduler import Job, Scheduler

pytest.importorskip("transformers")




def test_batch_sizes_and_their_split():
    assert prefill_sizes(16, 512) == [1, 2, 4] and prefill_sizes(512, 512) == [1]
    assert prefill_sizes(512, 1024) == [1, 2] and prefill_sizes(512, 2048) == [1, 2, 4]
    assert prefill_sizes(1024, 64) == [1]  # one prompt always, over the budget too
    assert prefill_sizes(16, 512, 1) == [1] and prefill_sizes(16, 512, 2) == [1, 2]  # --join-batch caps k
    assert split_sizes(7, [1, 2, 4]) == [4, 2, 1] and split_sizes(3, [1, 2]) == [2, 1]
    assert split_sizes(4, [1]) == [1, 1, 1, 1] and split_sizes(0, [1, 2, 4]) == []


def test_joins_prefilled_together_each_get_their_tokens_alone(model):
    # Seven prompts of bucket 16 (lengths 3..16: padded and not) join at once, prefilled as 4 + 2 + 1;
    # then a second batch joins the running rows; every request's tokens are those it gets alone.
    prompts = [[1, 5, 9], [1, 17, 33, 8, 54, 60, 2, 7, 11], [3] * 16, [1, 40, 41, 42, 43], [9, 8, 7, 6, 5, 4, 3, 2],
               [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [60, 61]]
    late = [[1, 70, 71, 72], [5] * 12]
    rows = Rows(model, rows=9, capacity=64, compile=False, cuda_graphs=False, prefill_tokens=64, join_batch=4)
    sizes = []
    real = rows.prefill.fn
    rows.prefill.fn = lambda m, tokens, *rest: (sizes.append(tuple(tokens.shape)), real(m, tokens, *rest))[1]
    assert rows.place(16, 10)
    got = {i: [t] for i, t in enumerate(rows.join_many([(i, p, 10, RowSettings()) for i, p in enumerate(prompts)]))}
    assert sizes == [(4, 16), (2, 16), (1, 16)]
    for _ in range(3):
        for row, token in rows.step().items():
            got[row].append(token)
    assert rows.place(12, 6)
    firsts = rows.join_many([(7 + i, p, 6, RowSettings()) for i, p in enumerate(late)])
    assert sizes[-1] == (2, 16)
    got.update({7 + i: [t] for i, t in enumerate(firsts)})
    for _ in range(6):
        new = rows.step()
        for row in got:
            if len(got[row]) < (10 if row < 7 else 6):
                got[row].append(new[row])
    engine = Engine(model)
    assert [got[i] for i in range(7)] == [engine.generate([p], max_new_tokens=10).tokens[0] for p in prompts]
    assert [got[7], got[8]] == [engine.generate([p], max_new_tokens=6).tokens[0] for p in late]


def test_a_seeded_request_samples_the_same_first_token_alone_or_in_a_batch(model):
    hot = RowSettings(temperature=1.5, top_k=20, top_p=0.95, seed=1234)
    prompt = [1, 17, 33, 8, 54]
    alone = Rows(model, rows=1, capacity=32, compile=False, cuda_graphs=False)
    assert alone.place(5, 4)
    first = alone.join(0, prompt, 4, hot)
    crowd = Rows(model, rows=4, capacity=32, compile=False, cuda_graphs=False)
    assert crowd.place(7, 4)
    joins = [(0, [1, 2, 3, 4, 5, 6, 7], 4, RowSettings()), (1, prompt, 4, hot),
             (2, [9, 9], 4, RowSettings(temperature=1.0, seed=9))]
    assert crowd.join_many(joins)[1] == first
    assert crowd.buf.temperature.tolist()[:3] == [0.0, 1.5, 1.0] and crowd.buf.seed.tolist()[:3] == [0, 1234, 9]


class GroupRows:
    """Rows that record which prompts each join_many call prefilled together."""

    rows, capacity = 8, 100

    def __init__(self):
        self.busy, self.calls = set(), []

    def free_rows(self, n):
        return [r for r in range(self.rows) if r not in self.busy][:n]

    def prefill_sizes(self, bucket):
        return prefill_sizes(bucket, 64)

    def place(self, prompt_len, max_tokens):
        return True

    def join_many(self, joins):
        self.calls.append([len(prompt) for _, prompt, _, _ in joins])
        self.busy.update(row for row, *_ in joins)
        return [0] * len(joins)

    def leave(self, row):
        self.busy.discard(row)

    def launch(self):
        return None

    def collect(self, launched):
        return {}


def test_the_scheduler_groups_the_queue_head_with_its_bucket_within_the_budget():
    rows = GroupRows()
    sched = Scheduler(rows, max_queue=16, prefill_tokens=64, sink=lambda e: None, metrics=ServeMetrics("m"))
    for n in (10, 12, 16, 9, 20, 16, 5, 5):  # buckets 16, 16, 16, 16, 32, 16, 16, 16
        sched.submit(Job([1] * n, 50, RowSettings()))
    sched._admit([])
    # 4 x 16 fits 64: the first four (47 tokens); 17 left, too few for the 20-token prompt: next time.
    assert rows.calls == [[10, 12, 16, 9]]
    sched._admit([])
    # the 20-token prompt (bucket 32) stops at the next bucket-16 prompt; 44 tokens left hold 2 x 16
    # (two prompts together), then 23 left hold one more.
    assert rows.calls[1:] == [[20], [16, 5], [5]]
    assert not sched.waiting and len(sched.running) == 8
