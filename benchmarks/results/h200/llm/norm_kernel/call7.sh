#!/bin/bash
# Call 7: int4@triton is not on the norm kernel's path (its norms are folded): this tree against 018ff85,
# kiln bench llm int4@triton at batch 1 and 16, new / base (one process each, own caches).
set -u
start=$(date +%s)
source benchmarks/device_env.sh
cp .b52/commit.txt "$R/commit.txt"
SITE=${PYTHONPATH#*:}
left() { echo $(( 470 - ($(date +%s) - start) )); }
run() {
  local name=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then echo "=== $name: skipped, $(left) s left"; return; fi
  step "$name" timeout -k 5 "$(( $(left) - 5 ))" "$@"
}
B=(-m kiln bench llm --model llama-3.2-3b --prompt-len 512 --new-tokens 128 --tuning decode --prefill eager --repeats 5
   --engines kiln-compiled --batch 1,16 --quant int4@triton)
run new 150 env TRITON_CACHE_DIR=/tmp/c/new/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c/new/inductor python3 "${B[@]}" --out "$R/new"
run base 150 env PYTHONPATH="$PWD/.b52/basetree/src:$SITE" TRITON_CACHE_DIR=/tmp/c/base/triton \
  TORCHINDUCTOR_CACHE_DIR=/tmp/c/base/inductor python3 "${B[@]}" --out "$R/base"
python3 - "$R" <<'PY'
import json, sys, pathlib
for t in ("new", "base"):
    p = pathlib.Path(sys.argv[1]) / t / "results.json"
    if p.exists():
        d = json.loads(p.read_text())
        print(t, [(r["batch"], r["quant"], round(r["decode_step_ms"], 4), r["greedy_match"]) for r in d["results"]])
PY
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
