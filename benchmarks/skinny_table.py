"""Which decode projections take kiln's dense row kernel (kiln.kernels.triton_skinny's TAKEN), from
a `benchmarks/rows_bench.py` run: a (row tile, N, K) is taken where `skinny` (at the table's
setting, with the fused work) was faster than `cublas` (alone) at every row count measured in that
tile (2-16 for the 16-row tile, 17-32, 33-64). Prints the set; with `--write FILE` rewrites the
lines between `# measured: begin` and `# measured: end` in FILE with it.

    python benchmarks/skinny_table.py ROWS_RESULTS_JSON [--write src/kiln/kernels/triton_skinny.py]
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--write", default=None)
    args = ap.parse_args(argv)
    keys = taken(json.loads(Path(args.results).read_text())["results"])
    body = "TAKEN: frozenset[tuple[int, int, int]] = frozenset({\n" + "".join(
        f"    {key},\n" for key in keys) + "})\n" if keys else "TAKEN: frozenset[tuple[int, int, int]] = frozenset()\n"
    print(body, end="")
    if args.write:
        path = Path(args.write)
        text, n = re.subn(r"(# measured: begin[^\n]*\n).*?(# measured: end)", lambda m: m[1] + body + m[2],
                          path.read_text(), flags=re.S)
        if n != 1:
            print(f"skinny_table: no '# measured: begin/end' block in {path}", file=sys.stderr)
            return 2
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
