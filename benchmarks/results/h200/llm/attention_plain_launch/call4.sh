#!/bin/bash
# Call 4: A/B of HEAD (one-chunk decode attention launched plainly, trigger kept) against 281230b (and one process of 11c117f), kiln bench llm bf16 and int4@triton, batch 16,32.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
cp .b53/commit.txt "$R/commit.txt"
SITE=${PYTHONPATH#*:}
left() { echo $(( 480 - ($(date +%s) - start) )); }
run() {
  local name=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then echo "=== $name: skipped, $(left) s left"; return; fi
  step "$name" timeout -k 5 "$(( $(left) - 5 ))" "$@"
}
B=(-m kiln bench llm --model llama-3.2-3b --prompt-len 512 --new-tokens 128 --tuning decode --prefill eager --repeats 5
   --engines kiln-compiled --batch 16,32 --quant none,int4@triton)
ROOT=$PWD
NEW=(env TRITON_CACHE_DIR=/tmp/c/new/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c/new/inductor python3 "${B[@]}")
BASE=(env PYTHONPATH="$ROOT/.b53/basetree/src:$SITE" TRITON_CACHE_DIR=/tmp/c/base/triton
      TORCHINDUCTOR_CACHE_DIR=/tmp/c/base/inductor python3 "${B[@]}")
PREV=(env PYTHONPATH="$ROOT/.b53/prevtree/src:$SITE" TRITON_CACHE_DIR=/tmp/c/prev/triton
      TORCHINDUCTOR_CACHE_DIR=/tmp/c/prev/inductor python3 "${B[@]}")
run new1 110 "${NEW[@]}" --out "$R/new1"
run base1 110 "${BASE[@]}" --out "$R/base1"
run new2 60 "${NEW[@]}" --out "$R/new2"
run base2 60 "${BASE[@]}" --out "$R/base2"
run prev1 110 "${PREV[@]}" --out "$R/prev1"
grep -h "kiln/__init__\|src/kiln" "$R"/base1.log | head -2
python3 - "$R" <<'PY'
import json, sys, pathlib
for t in ("new1", "base1", "new2", "base2", "prev1"):
    p = pathlib.Path(sys.argv[1]) / t / "results.json"
    if p.exists():
        d = json.loads(p.read_text())
        print(t, [(r["quant"], r["batch"], round(r["decode_step_ms"], 4), r["greedy_match"]) for r in d["results"]])
PY
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
