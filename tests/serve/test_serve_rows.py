"""Continuous batching on CPU: requests joining and leaving a running batch get exactly the tokens
they get decoded alone (greedy), through compaction too; seeded sampling ignores its neighbours."""

from __future__ import annotations

import pytest
import torch

from kiln.llm import Engine
from kiln.llm.block_compile import EDGES
from kiln.serve.row_sampling import hashed_uniform, pick_tokens
from kiln.serve.rows import Rows, RowSettings, batch_buckets

pytest.importorskip("transformers")




def alone(model, prompt, n):
    return Engine(model).generate([prompt], max_new_tokens=n).tokens[0]


def run_schedule(rows: Rows, plan: dict[int, list[tuple[list[int], int, RowSettings]]], steps: int):
    """Join the requests of `plan[step]` before that decode step; tokens per request, in plan order."""
    out: dict[int, list[int]] = {}
    row_of: dict[int, int] = {}
    budget: dict[int, int] = {}
    order = [req for step in sorted(plan) for req in plan[step]]
    for step in range(steps):
        for prompt, n, settings in plan.get(step, []):
            i = order.index((prompt, n, settings))
            row = rows.free_row()
            assert row is not None and rows.place(len(prompt), n)
            out[i] = [rows.join(row, prompt, n, settings)]
            row_of[i], budget[i] = row, n
        for i, row in list(row_of.items()):
            if len(out[i]) == budget[i]:
                rows.leave(row)
                del row_of[i]
        if rows.busy:
            new = rows.step()
            for i, row in row_of.items():
                out[i].append(new[row])
    return [out[i] for i in range(len(order))]


def test_buckets():
    assert batch_buckets(1) == [1] and batch_buckets(6) == [1, 2, 4, 6] and batch_buckets(8) == [1, 2, 4, 8]
    assert batch_buckets(64, [32, 1, 8]) == [1, 8, 32, 64]


def test_joining_and_leaving_rows_give_each_request_its_tokens_alone(model):
    greedy = RowSettings()
    a, b, c, d = [1, 17, 33, 8, 54], [1, 40, 41], [1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [3]
    plan = {0: [(a, 9, greedy)], 2: [(b, 6, greedy)], 5: [(c, 7, greedy), (d, 4, greedy)]}
    rows = Rows(model, rows=4, capacity=64, compile=False, cuda_graphs=False)
    shifts = []
    real_shift = rows._shift
    rows._shift = lambda n: (shifts.append(n), real_shift(n))
    got = run_schedule(rows, plan, steps=16)
    assert shifts == [7]  # c's 17 tokens need the cursor (10) moved right
    assert got == [alone(model, a, 9), alone(model, b, 6), alone(model, c, 7), alone(model, d, 4)]
    assert not rows.busy


def test_compaction_keeps_running_rows_exact(model):
    # capacity 40: the third request only fits once the rows shift left past the first one's slots.
    greedy = RowSettings()
    a, b, c = [1, 17, 33, 8, 54], [1, 40, 41, 42], [1, 60, 61, 62, 63, 64]
    plan = {0: [(a, 12, greedy)], 3: [(b, 30, greedy)], 16: [(c, 20, greedy)]}
    rows = Rows(model, rows=2, capacity=40, compile=False, cuda_graphs=False)
    shifts = []
    real_shift = rows._shift
    rows._shift = lambda n: (shifts.append(n), real_shift(n))
    got = run_schedule(rows, plan, steps=40)
    assert shifts == [-4]  # row b's 4 padding slots (it joined at cursor 8 with 4 tokens)
    assert got == [alone(model, a, 12), alone(model, b, 30), alone(model, c, 20)]


def test_a_shift_copies_the_rows_up_to_the_last_busy_one_and_a_row_past_them_joins_exact(model):
    # As above with 4 rows: at the shift only row 1 is busy, so rows 2 and 3 keep their old slots;
    # d then joins row 2 (a and c hold 0 and 1), which its prefill and steps overwrite before reading.
    greedy = RowSettings()
    a, b, c, d = [1, 17, 33, 8, 54], [1, 40, 41, 42], [1, 60, 61, 62, 63, 64], [1, 9, 8, 7, 6, 5, 4]
    plan = {0: [(a, 12, greedy)], 3: [(b, 30, greedy)], 16: [(c, 20, greedy)], 17: [(d, 8, greedy)]}
    rows = Rows(model, rows=4, capacity=40, compile=False, cuda_graphs=False)
    for t in (*rows.buf.cache.k, *rows.buf.cache.v):
        t[2:].fill_(7.0)  # stale keys and values where d will join
    copied = []
    real_shift = rows._shift
    rows._shift = lambda n: (copied.append(max(rows.busy) + 1), real_shift(n))
    got = run_schedule(rows, plan, steps=40)
    assert copied == [2]
    assert got == [alone(model, a, 12), alone(model, b, 30), alone(model, c, 20), alone(model, d, 8)]


def test_place_waits_when_no_room(model):
    rows = Rows(model, rows=2, capacity=24, compile=False, cuda_graphs=False)
    assert rows.place(4, 20)
    rows.join(0, [1, 2, 3, 4], 20, RowSettings())
    assert not rows.place(8, 4)  # the cursor (4) is before the end of an 8-token prompt
    assert rows.place(2, 18) and rows.cursor == 4
    assert not rows.place(2, 21)  # the busy row starts at slot 0: nothing to shift


def test_rows_compiled_per_block_give_each_request_its_tokens_alone(model):
    """The server's default compile scope (`blocks`, inductor on CPU): one compiled block serves every
    layer, batch bucket and prompt bucket, the decode step's edges are compiled, the tokens are
    eager's (a seeded sampled row's too: the compiled sampling draws the same hashed noise), and the
    model is left as it was."""
    greedy = RowSettings()
    hot = RowSettings(temperature=1.5, top_k=20, top_p=0.95, seed=1234)
    a, b = [1, 17, 33, 8, 54], [1, 40, 41]
    plan = {0: [(a, 6, greedy)], 2: [(b, 5, greedy)]}
    rows = Rows(model, rows=2, capacity=40, compile=True, cuda_graphs=False)
    assert set(rows._decode_blocks.edges) == set(EDGES) and not rows._prefill_blocks.edges  # decode's edges compiled
    got = run_schedule(rows, plan, steps=8)
    assert got == [alone(model, a, 6), alone(model, b, 5)]
    sampled = {0: [(a, 6, greedy)], 1: [(b, 6, hot)]}
    eager = run_schedule(Rows(model, rows=2, capacity=40, compile=False, cuda_graphs=False), sampled, steps=8)
    assert run_schedule(Rows(model, rows=2, capacity=40, compile=True, cuda_graphs=False), sampled, steps=8) == eager
    assert all("forward" not in layer.__dict__ for layer in model.layers)
    assert not set(EDGES) & set(model.__dict__)


def test_seeded_sampling_does_not_depend_on_the_batch(model):
    prompt = [1, 17, 33, 8, 54]
    hot = RowSettings(temperature=1.5, top_k=20, top_p=0.95, seed=1234)
    solo = run_schedule(Rows(model, rows=1, capacity=48, compile=False, cuda_graphs=False),
                        {0: [(prompt, 10, hot)]}, steps=12)[0]
    crowd = run_schedule(Rows(model, rows=4, capacity=48, compile=False, cuda_graphs=False),
                         {0: [([1, 40, 41], 10, RowSettings())], 1: [(prompt, 10, hot)],
                          2: [([1, 2], 6, RowSettings(temperature=1.0, seed=9))]}, steps=14)[1]
    assert solo == crowd
    other = run_schedule(Rows(model, rows=1, capacity=48, compile=False, cuda_graphs=False),
                         {0: [(prompt, 10, RowSettings(temperature=1.5, top_k=20, top_p=0.95, seed=99))]}, steps=12)[0]
    assert other != solo


def test_hashed_noise_is_uniform_and_keyed():
    u = hashed_uniform(torch.tensor([3, 3, 4]), torch.tensor([7, 8, 7]), 4096)
    assert u.min() > 0 and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.02
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert torch.equal(u[0], hashed_uniform(torch.tensor([3]), torch.tensor([7]), 4096)[0])


def test_pick_tokens_mixes_greedy_and_sampled_rows():
    logits = torch.tensor([[0.0, 5.0, 1.0], [0.0, 5.0, 1.0]])
    t = pick_tokens(logits, torch.tensor([0.0, 1.0]), torch.tensor([0, 1]), torch.tensor([1.0, 1.0]),
                    torch.tensor([1, 2]), torch.tensor([4, 4]), False)
    assert t.tolist() == [1, 1]  # row 0 greedy; row 1 top-1 keeps only the best
    t = pick_tokens(logits, torch.tensor([0.0, 0.0]), torch.tensor([0, 0]), torch.tensor([1.0, 1.0]),
                    torch.tensor([1, 2]), torch.tensor([4, 4]), True)
    assert t.tolist() == [1, 1]


def closed_loop(model, L: int, N: int, cap: int):
    """Every row that frees is taken at once by a new request (`L`-token prompts, `N` tokens each);
    (the step a join had to wait at or None, each request's tokens, the shifts)."""
    rows = Rows(model, rows=3, capacity=cap, compile=False, cuda_graphs=False)
    shifts = []
    real_shift = rows._shift
    rows._shift = lambda n: (shifts.append(n), real_shift(n))
    prompts = [[1 + (7 * i + j) % 90 for j in range(L)] for i in range(24)]
    got: dict[int, list[int]] = {}
    row_of: dict[int, int] = {}
    nxt = 0
    for step in range(30):
        while nxt < len(prompts) and (row := rows.free_row()) is not None and (step > 0 or nxt == 0):
            if not rows.place(L, N):
                return step, got, shifts
            got[nxt] = [rows.join(row, prompts[nxt], N, RowSettings())]
            row_of[nxt] = row
            nxt += 1
        new = rows.step() if rows.busy else {}
        for i, row in list(row_of.items()):
            got[i].append(new[row])
            if len(got[i]) == N:
                rows.leave(row)
                del row_of[i]
    return None, {i: (prompts[i], t) for i, t in got.items()}, shifts


def test_closed_loop_joins_wait_only_when_rows_lack_room_for_prompt_and_twice_the_answer(model):
    # The benchmark's load scaled down (512-token prompts, 128 new tokens, 1024 slots): all rows share
    # one cursor, so a join needs the cursor >= L and <= capacity - N; a left shift frees at most the
    # oldest busy row's padding, which leaves room only if capacity >= L + 2N - 2 (here 14).
    waited, got, shifts = closed_loop(model, 8, 4, 14)
    assert waited is None and len(got) > 12 and len(shifts) >= 3 and all(s < 0 for s in shifts)
    late = max(i for i in got if len(got[i][1]) == 4)  # admitted after shifts: still exact
    assert got[late][1] == alone(model, got[late][0], 4)
    assert closed_loop(model, 8, 4, 13)[0] == 3
