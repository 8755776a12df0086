"""Which decode projections take kiln's dense row kernel (kiln.kernels.triton_skinny's TAKEN), from
a `benchmarks/rows_bench.py` run: a (row tile, N, K) is taken where `skinny` (at the table's
setting, with the fused work) was faster than `cublas` (alone) at every row count measured in that
tile (2-16 for the 16-row tile, 17-32, 33-64). Prints the set; with `--write FILE` rewrites the
lines between `# measured: begin` and `# measured: end` in FILE with it.

With `--gpu NAME`, from a run with `--sweep-skinny` on that GPU: its `GPU_TABLES` entry instead, the
shapes outside TAKEN where the kernel's fastest swept setting (least time summed over the tile's
row counts) beat `cublas` at every row count of the tile, each with that setting; `--write` rewrites
the lines between `# measured (NAME): begin` and `# measured (NAME): end`.

    python benchmarks/skinny_table.py ROWS_RESULTS_JSON [--gpu H200] [--write src/kiln/kernels/triton_skinny.py]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path


def row_tile(rows: int) -> int:
    """kiln.kernels.triton_rows.block_m without Triton: rows padded to 16, then a power of two."""
    return max(16, 1 << (rows - 1).bit_length())


def taken(results: list[dict]) -> list[tuple[int, int, int]]:
    """The (row tile, N, K) where skinny beat cublas at every measured row count >= 2 of the tile."""
    by = defaultdict(dict)
    for r in results:
        if r["variant"] in ("skinny", "cublas") and r["rows"] >= 2:
            by[(row_tile(r["rows"]), *r["shape"], r["rows"])][r["variant"]] = r["us_per_call"]
    wins = defaultdict(list)
    for (tile, n, k, _), us in by.items():
        if len(us) == 2:
            wins[(tile, n, k)].append(us["skinny"] < us["cublas"])
    return sorted(key for key, won in wins.items() if all(won))


def gpu_table(results: list[dict], exclude: set[tuple[int, int, int]]
              ) -> dict[tuple[int, int, int], tuple[int, int, int, int, int]]:
    """(row tile, N, K) -> the fastest swept setting (`skinny BN/BK/SPLIT/warps/stages` rows, least
    time summed over the tile's row counts) where it beat cublas at every measured row count >= 2 of
    the tile; shapes in `exclude` (TAKEN) left out."""
    cublas, swept = {}, defaultdict(lambda: defaultdict(dict))
    for r in results:
        if r["rows"] < 2:
            continue
        key = (row_tile(r["rows"]), *r["shape"])
        if r["variant"] == "cublas":
            cublas.setdefault(key, {})[r["rows"]] = r["us_per_call"]
        elif r["variant"].startswith("skinny "):
            setting = tuple(int(v) for v in r["variant"].split(" ", 1)[1].split("/"))
            swept[key][setting][r["rows"]] = r["us_per_call"]
    table = {}
    for key, settings in sorted(swept.items()):
        base = cublas.get(key)
        if not base or key in exclude:
            continue
        full = {s: us for s, us in settings.items() if set(us) >= set(base)}  # timed at every row count
        if not full:
            continue
        best = min(full, key=lambda s: sum(full[s][n] for n in base))
        if all(full[best][n] < base[n] for n in base):
            table[key] = best
    return table


def gpu_entry(name: str, table: dict[tuple[int, int, int], tuple[int, int, int, int, int]]) -> str:
    """The GPU_TABLES entry (source lines) for `name`."""
    shapes = ", ".join(str(k) for k in table)
    settings = ", ".join(f"{k}: {v}" for k, v in table.items())
    return (f'    "{name}": (frozenset({{{shapes}}}),\n'
            f"             {{{settings}}}),\n")


def _rewrite(path: Path, marker: str, body: str) -> bool:
    """Replace the lines between `# {marker}: begin` and `# {marker}: end` in `path`; False: none there."""
    begin, end = re.escape(f"# {marker}: begin"), re.escape(f"# {marker}: end")
    text, n = re.subn(rf"({begin}[^\n]*\n).*?(\s*{end})", lambda m: m[1] + body.rstrip("\n") + m[2],
                      path.read_text(), flags=re.S)
    if n == 1:
        path.write_text(text)
    return n == 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--gpu", default=None, help="write this GPU's GPU_TABLES entry (a word of its device name)")
    ap.add_argument("--write", default=None)
    args = ap.parse_args(argv)
    results = json.loads(Path(args.results).read_text())["results"]
    if args.gpu:
        from kiln.kernels.triton_skinny import TAKEN

        body, marker = gpu_entry(args.gpu, gpu_table(results, set(TAKEN))), f"measured ({args.gpu})"
    else:
        keys = taken(results)
        body = "TAKEN: frozenset[tuple[int, int, int]] = frozenset({\n" + "".join(
            f"    {key},\n" for key in keys) + "})\n" if keys else "TAKEN: frozenset[tuple[int, int, int]] = frozenset()\n"
        marker = "measured"
    print(body, end="")
    if args.write and not _rewrite(Path(args.write), marker, body):
        print(f"skinny_table: no '# {marker}: begin/end' block in {args.write}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
