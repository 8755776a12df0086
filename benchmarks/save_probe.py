"""Write and checksum time of a checkpoint on this machine's disk, by DCP writer threads: one process
saves GIB of fp32 CPU tensors with `dcp.save` through kiln's `file_writer` (one file per thread,
fsynced, as `kiln train` with `checkpoint.writer_threads=N` writes a rank's share; `--device cuda`:
tensors on the GPU, as a blocking save such as the final one writes them), then computes the
completion marker's checksums of the files twice, one file at a time and several at once (kiln's
`file_digests`). After one untimed write, thread counts are interleaved over ROUNDS rounds, each in
a fresh directory under DIR that is removed after it; medians per thread count.

    python benchmarks/save_probe.py [--gib 8] [--threads 1,2,4,8] [--rounds 2] [--dir /tmp/kiln-save-probe] [--device cpu]
                                    # writes $OUT/save_probe.json (default /tmp)
"""
import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from kiln.checkpoint import layout
from kiln.checkpoint.dcp_io import file_writer, quiet_single_process

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--gib", type=int, default=8)
ap.add_argument("--threads", default="1,2,4,8")
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--dir", default="/tmp/kiln-save-probe")
ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
args = ap.parse_args()
threads = [int(t) for t in args.threads.split(",")]
gen = torch.Generator().manual_seed(0)
state = {f"p{i}": torch.rand(64, 1024, 1024, generator=gen).to(args.device) for i in range(args.gib * 4)}  # 256 MiB each
nbytes = sum(t.numel() * t.element_size() for t in state.values())
out = {"torch": torch.__version__, "device": args.device, "gib": args.gib, "bytes": nbytes, "cpus": os.cpu_count(),
       "hash_threads": layout.HASH_THREADS, "runs": []}
parallel_threads = layout.HASH_THREADS
warm = Path(args.dir) / "warm-up"  # the process's first write is slower at any thread count: untimed
shutil.rmtree(warm, ignore_errors=True)
with quiet_single_process():
    dcp.save(state, storage_writer=file_writer(warm, threads[0]))
shutil.rmtree(warm, ignore_errors=True)
for r in range(args.rounds):
    for n in threads[r % len(threads):] + threads[:r % len(threads)]:  # each round starts elsewhere
        where = Path(args.dir) / f"r{r}_t{n}"
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir(parents=True)
        t0 = time.perf_counter()
        with quiet_single_process():
            dcp.save(state, storage_writer=file_writer(where, n))
        write_s = time.perf_counter() - t0
        files = sorted(f for f in where.rglob("*") if f.is_file())
        hashes = {}
        for mode in (("one", "several") if r % 2 == 0 else ("several", "one")):
            layout.HASH_THREADS = 1 if mode == "one" else parallel_threads
            t0 = time.perf_counter()
            digests = layout.file_digests(files)
            hashes[mode] = (time.perf_counter() - t0, digests)
        layout.HASH_THREADS = parallel_threads
        assert hashes["one"][1] == hashes["several"][1]
        run = {"round": r, "threads": n, "files": len(files), "write_s": round(write_s, 3),
               "write_gb_s": round(nbytes / write_s / 1e9, 3), "hash_one_s": round(hashes["one"][0], 3),
               "hash_several_s": round(hashes["several"][0], 3)}
        out["runs"].append(run)
        print(run, flush=True)
        shutil.rmtree(where, ignore_errors=True)
out["median"] = {n: {k: statistics.median(x[k] for x in out["runs"] if x["threads"] == n)
                     for k in ("write_s", "write_gb_s", "hash_one_s", "hash_several_s")} for n in threads}
print(json.dumps(out["median"]))
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "save_probe.json"), "w"), indent=1)
