#!/bin/bash
# Call 7: the decode attention op alone (benchmarks/decode_attention_bench.py, fixed), this tree against d4b7e8f's src
# (before the reads-ahead change), batch 1, 4 and 8 (several chunks per row and head), kiln's own launch setting,
# interleaved by tree; then at batch 1 a small sweep of block size and warps with this tree.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
ROOT=$PWD
SITE=${PYTHONPATH#$ROOT/src:}
tree() {
  local t=$1; shift
  local src=$ROOT/src; [ "$t" = base ] && src=$ROOT/.b56/basetree/src
  env PYTHONPATH="$src:$SITE" TRITON_CACHE_DIR=/tmp/c_$t/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c_$t/inductor "$@"
}
# the bench itself from this checkout in both: only the kernel's tree differs
for b in 1 4 8; do
  for t in new base; do
    step attn_${t}_b$b tree $t timeout 90 python3 benchmarks/decode_attention_bench.py --out "$R/attn_${t}_b$b" \
      --batch $b --slots 640 --rope --blocks 32 --targets 256 --warps 2 --repeats 30
  done
done
step sweep_b1 tree new timeout 150 python3 benchmarks/decode_attention_bench.py --out "$R/sweep_b1" --batch 1 \
  --slots 640 --rope --blocks 16,32,64 --targets 128,256 --warps 2,4 --repeats 20
python3 - "$R" <<'PY'
import json, sys, pathlib
for p in sorted(pathlib.Path(sys.argv[1]).glob("*/results.json")):
    rows = json.loads(p.read_text())["results"]
    print(p.parent.name, [(r["variant"], round(r["us_per_call"], 3)) for r in rows if r["variant"].startswith("rope")][:12])
PY
find "$R" -name "*.png" -delete
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
