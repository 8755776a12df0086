"""What a join costs `kiln serve` between decode steps: the prefill of a 512-token prompt into a row.

`kiln serve`'s rows (kiln.serve.rows) of the Llama-3.2-3B shape with random weights, built as the
server builds them (kiln.serve.server.build_rows), one `--compile-scope` per process. For each:
the time of `Rows.join` of a 512-token prompt (and a 511-token one, the padded attention path),
synchronized, after warm-up, median of `--repeats`; where the rows prefill several joins in one
forward (`Rows.join_many`), the time per join of k prompts together; and, with `--profile`, a
torch.profiler table of a few joins (top kernels by device time, the host's time beside them: is
the join launch-bound, where does it wait?). One JSON line per process appended to `--out`.

It runs against whichever kiln is on PYTHONPATH, so the same script times two trees in one call:

    PYTHONPATH=src python benchmarks/serve_prefill_probe.py --scope blocks --label new --out probe.jsonl
    python benchmarks/serve_prefill_probe.py --model llama-tiny --device cpu --repeats 2 --out /tmp/p.jsonl

`--scope step` compiles the whole prefill: minutes on a GPU; bound it from outside (`timeout`).
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
from pathlib import Path

import torch

from kiln.serve.rows import RowSettings
from kiln.serve.serve_options import ServeOptions
from kiln.serve.server import build_rows, check_serve
from kiln.timing import time_calls, time_each


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_joins(rows, prompts: list[list[int]], repeats: int) -> float:
    """Median seconds per join of `prompts` joined together (one at a time when the rows cannot)."""
    joins = [(row, prompt, 8, RowSettings()) for row, prompt in enumerate(prompts)]

    def join() -> None:
        assert rows.place(max(map(len, prompts)), 8)
        if hasattr(rows, "join_many"):
            rows.join_many(joins)
        else:
            for one in joins:
                rows.join(*one)

    def leave(_: int) -> None:
        for row in range(len(prompts)):
            rows.leave(row)

    return statistics.median(time_each(join, repeats, device=rows.device, after=leave)) / len(prompts)


def warm(rows, bucket: int, padded: bool, k: int) -> float:
    if "k" in inspect.signature(rows.warm_prefill).parameters:
        return time_calls(lambda: rows.warm_prefill(bucket, padded, k), calls=1, device=rows.device)
    return time_calls(lambda: rows.warm_prefill(bucket, padded), calls=1, device=rows.device)


def profile_table(rows, prompt: list[int], joins: int, top: int) -> tuple[str, dict]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if rows.device.type == "cuda" else [])
    sync(rows.device)
    with profile(activities=activities) as prof:
        for _ in range(joins):
            timed_joins(rows, [prompt], 1)
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events) / joins
    kernels = sum(e.count for e in events if e.device_type.name == "CUDA") / joins
    sort = "self_cuda_time_total" if rows.device.type == "cuda" else "self_cpu_time_total"
    table = events.table(sort_by=sort, row_limit=top, max_name_column_width=70)
    return table, {"device_us_per_join": device_us, "device_events_per_join": kernels}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-3.2-3b")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--scope", choices=("blocks", "step", "none"), default="blocks",
                    help="none: eager (compile off, no CUDA graphs)")
    ap.add_argument("--label", default="", help="which tree this is (e.g. before, after)")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--ks", default="1", help="joins prefilled together, comma-separated (needs join_many)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--profile", default="", help="append a torch.profiler table of one join here")
    ap.add_argument("--out", required=True, help="append one JSON line here")
    a = ap.parse_args()
    ks = [int(k) for k in a.ks.split(",")]
    n = a.prompt_len
    opts = ServeOptions(model=a.model, device=a.device, max_batch=max(ks), batch_buckets=[max(ks)],
                        max_seq_len=a.max_seq_len, compile="off" if a.scope == "none" else "on",
                        compile_scope="blocks" if a.scope == "none" else a.scope, prefill_tokens=max(ks) * n)
    setup = check_serve(opts)
    rows = build_rows(setup, print)
    batched = hasattr(rows, "join_many")
    ks = ks if batched else [1]
    record = {"label": a.label, "scope": a.scope, "model": a.model, "prompt_len": n, "batched_joins": batched,
              "device": torch.cuda.get_device_name() if rows.device.type == "cuda" else "cpu",
              "torch": torch.__version__, "warm_s": {}, "join_ms": {}}
    prompt = [(7 * i + 3) % setup.source.config.vocab_size for i in range(n)]
    for k in ks:
        for padded, length in ((False, n), (True, n - 1)):
            name = f"{k}x{length}"
            record["warm_s"][name] = round(warm(rows, n, padded, k), 2)
            print(f"warmed {name} in {record['warm_s'][name]} s", flush=True)
            record["join_ms"][name] = round(1e3 * timed_joins(rows, [prompt[:length]] * k, a.repeats), 3)
            print(f"join {name}: {record['join_ms'][name]} ms per join", flush=True)
    if a.profile:
        table, summary = profile_table(rows, prompt, 3, 25)
        record.update(summary)
        with open(a.profile, "a") as f:
            f.write(f"=== {a.label} scope={a.scope}: one {n}-token join, 3 joins profiled, per-join totals "
                    f"{json.dumps(summary)}\n{table}\n")
    print(json.dumps(record), flush=True)
    with Path(a.out).open("a") as f:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
