#!/bin/bash
# Call 6: A/B of the decode attention change (HEAD) against HEAD~1 (.b56/basetree/src), one call:
# the attention op alone at batch 1 (decode_attention_bench, defaults), then kiln bench llm at batch 1 and 16,
# bf16 and int4@triton, processes new / base / new / base, each tree with its own compile caches.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
ROOT=$PWD
SITE=${PYTHONPATH#$ROOT/src:}
left() { echo $(( 560 - ($(date +%s) - start) )); }
tree() {  # new|base CMD...: run under that tree's src and caches
  local t=$1; shift
  local src=$ROOT/src; [ "$t" = base ] && src=$ROOT/.b56/basetree/src
  env PYTHONPATH="$src:$SITE" TRITON_CACHE_DIR=/tmp/c_$t/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c_$t/inductor "$@"
}
for t in new base new2 base2; do
  step attn_$t tree ${t%2} timeout 120 python3 benchmarks/decode_attention_bench.py --out "$R/attn_$t" --batch 1 \
    --slots 640 --rope --blocks 32 --targets 256 --warps 2 --repeats 30
done
COMMON=(--model llama-3.2-3b --prompt-len 512 --new-tokens 128 --tuning decode --prefill eager --repeats 5
        --engines kiln-compiled --batch 1,16 --quant none,int4@triton)
for t in new base new2 base2; do
  if [ "$(left)" -lt 80 ]; then echo "=== skip $t: $(left) s left"; continue; fi
  step e2e_$t tree ${t%2} timeout $(( $(left) - 5 )) python3 -m kiln bench llm "${COMMON[@]}" --out "$R/e2e_$t"
done
python3 - "$R" <<'PY'
import json, sys, pathlib
for t in ("new", "base", "new2", "base2"):
    p = pathlib.Path(sys.argv[1]) / f"e2e_{t}" / "results.json"
    if p.exists():
        print(t, [(r["batch"], r["quant"], round(r["decode_step_ms"], 4)) for r in json.loads(p.read_text())["results"]])
    a = pathlib.Path(sys.argv[1]) / f"attn_{t}" / "results.json"
    if a.exists():
        print(t, [(r.get("variant"), round(r.get("us_per_call", 0), 3)) for r in json.loads(a.read_text()).get("results", [])])
PY
find "$R" -name "*.png" -delete
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
