#!/bin/bash
# Call 2: this tree with SWAP_X_ONCE and SWAP_SCALES_AHEAD on (the working tree's defaults): the headline batch 1 and 16
# rows, bf16 and int4@triton; then int4@triton batch 16 and 32 with one launch setting of the row kernel switched
# per process (benchmarks/with_settings.py), the defaults first and again later, on shared caches.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
cp .b54/commit.txt "$R/commit.txt"
git diff > "$R/tree.diff" 2>/dev/null || true
export TRITON_CACHE_DIR=/tmp/c/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c/inductor
left() { echo $(( 545 - ($(date +%s) - start) )); }
COMMON=(--model llama-3.2-3b --prompt-len 512 --new-tokens 128 --tuning decode --prefill eager --repeats 5
        --engines kiln-compiled)
step head timeout 300 python3 -m kiln bench llm "${COMMON[@]}" --batch 1,16 --quant none,int4@triton --out "$R/head"
one() {  # NAME SETTING...
  local name=$1; shift
  if [ "$(left)" -lt 55 ]; then echo "=== skip $name: $(left) s left"; return; fi
  step "$name" timeout $(( $(left) - 5 )) python3 benchmarks/with_settings.py "$@" -- bench llm "${COMMON[@]}" \
    --batch 16,32 --quant int4@triton --out "$R/$name"
}
T=kiln.kernels.triton_rows
one d1 $T.PROGRAMS_PER_SM=2
one p4 $T.PROGRAMS_PER_SM=4
one s4 $T.DECODE_STAGES=4
one bn64 $T.DECODE_BLOCK_N=64
one w2 $T.DECODE_WARPS=2
one d2 $T.PROGRAMS_PER_SM=2
one p4b $T.PROGRAMS_PER_SM=4
one s2 $T.DECODE_STAGES=2
python3 - "$R" <<'PY'
import json, sys, pathlib
for t in ("head", "d1", "p4", "s4", "bn64", "w2", "d2", "p4b", "s2"):
    p = pathlib.Path(sys.argv[1]) / t / "results.json"
    if p.exists():
        d = json.loads(p.read_text())
        print(t, [(r["batch"], r.get("quant"), round(r["decode_step_ms"], 4)) for r in d["results"]])
PY
find "$R" -name "*.png" -delete
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
