"""`kiln serve`'s warm-up: compile (and capture) every decode batch bucket and every prompt bucket's
prefill before the server binds its port, so no request pays a compile under load (a first use
of a bucket mid-load stalls every running stream for as long as the compile takes).

The server binds only after warm-up: a client polling `/health` sees a refused connection, then
200. Each variant's seconds are logged; the total goes to `/metrics` and `/health`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from kiln.compile_cache import cache_use, reason
from kiln.errors import ConfigError
from kiln.llm.engine import bucket_length
from kiln.serve.rows import Rows


def prompt_buckets(capacity: int) -> list[int]:
    """Every prompt bucket a request can use: a prompt is at most `capacity - 1` tokens (one slot
    is left for a new token)."""
    top, out, n = bucket_length(capacity - 1), [], 1
    while bucket_length(n) <= top:
        out.append(bucket_length(n))
        n = out[-1] + 1
    return out


def chosen_prompt_buckets(capacity: int, chosen: list[int]) -> list[int]:
    """`chosen` (`--warmup-prompt-buckets`) checked against the buckets of `capacity`, sorted;
    every bucket when none is chosen."""
    valid = prompt_buckets(capacity)
    wrong = [b for b in chosen if b not in valid]
    if wrong:
        raise ConfigError("--warmup-prompt-buckets", f"{','.join(map(str, wrong))} is not a prompt bucket of "
                          f"--max-seq-len={capacity}", tuple(map(str, valid)))
    return sorted(set(chosen)) if chosen else valid


def warm_up(rows: Rows, buckets: list[int], say: Callable[[str], None],
            clock: Callable[[], float] = time.perf_counter) -> float:
    """Compile every decode bucket (greedy-only and sampling variants) and the prefill of each of
    `buckets` for each number of prompts prefilled together (`rows.prefill_sizes`; prompts filling
    the bucket and shorter ones: two variants, as unpadded prompts take another attention path);
    one line per variant (its seconds, and the graphs and Triton kernels it compiled or loaded from
    the caches: kiln.compile_cache.reason), then the total. Returns the total seconds."""
    def timed(what: str, work: Callable[[], None]) -> float:
        start = clock()
        with cache_use() as use:
            work()
            if rows.device.type == "cuda":
                torch.cuda.synchronize(rows.device)
        seconds = clock() - start
        why = reason(use.counts())
        say(f"kiln: warmed {what} in {seconds:.1f} s" + (f" ({why})" if why else ""))
        return seconds

    total, prefills = 0.0, 0
    for n in rows.buckets:
        for greedy in (True, False):
            total += timed(f"decode batch {n} ({'greedy' if greedy else 'sampling'})",
                           lambda n=n, greedy=greedy: rows.warm_decode(n, greedy))
    for bucket in buckets:  # a prompt filling the bucket only where it leaves a slot for a new token
        for k in rows.prefill_sizes(bucket):
            for padded in (False, True) if bucket < rows.capacity else (True,):
                prefills += 1
                what = f"{k} x " if k > 1 else ""
                total += timed(f"prefill {what}{bucket - 1 if padded else bucket}-token prompt (bucket {bucket})",
                               lambda bucket=bucket, padded=padded, k=k: rows.warm_prefill(bucket, padded, k))
    say(f"kiln: warm-up done in {total:.1f} s ({2 * len(rows.buckets)} decode and {prefills} prefill variants)")
    return total
