"""One line per row of every `kiln bench llm` results.json under a directory (the GPU scripts'
closing summary): decode tok/s, roofline fraction, ratio to the unquantized row, decode attention,
drift KL, warm-up and a skip reason.

    python benchmarks/llm_rows.py DIR [--glob 'bench_*/results.json']
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--glob", default="bench_*/results.json")
    args = ap.parse_args(argv)
    for path in sorted(Path(args.dir).glob(args.glob)):
        for r in json.loads(path.read_text())["results"]:
            def fig(key: str, fmt: str, r=r) -> str:
                return format(r[key], fmt) if r.get(key) is not None else "-"
            label = r["engine"] + ("" if r.get("quant", "none") == "none" else f"[{r['quant']}]")
            print(f"{path.parent.name:18} {label:28} {r['status']:8} decode {fig('decode_tok_s', '7.1f')} tok/s  "
                  f"roofline {fig('roofline_frac', '.3f')}  x{fig('decode_vs_unquantized', '.2f')} vs bf16  "
                  f"attention {r.get('decode_attention') or '-'}  KL {fig('drift_kl', '.3g')}  "
                  f"warm-up {fig('warmup_s', '.0f')} s  {r.get('reason') or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
