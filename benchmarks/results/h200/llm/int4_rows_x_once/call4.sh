#!/bin/bash
# Call 4: this tree (SWAP_X_ONCE and SWAP_SCALES_AHEAD on), int4@triton batch 16 and 32 with the row kernel's
# row block (32: batch 32's weights read once) or output block (256, 8 warps) switched per process
# (benchmarks/with_settings.py), the defaults first and again later, on shared caches.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
cp .b54/commit.txt "$R/commit.txt"
export TRITON_CACHE_DIR=/tmp/c/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c/inductor
left() { echo $(( 440 - ($(date +%s) - start) )); }
COMMON=(--model llama-3.2-3b --prompt-len 512 --new-tokens 128 --tuning decode --prefill eager --repeats 5
        --engines kiln-compiled)
one() {  # NAME SETTING...
  local name=$1; shift
  if [ "$(left)" -lt 55 ]; then echo "=== skip $name: $(left) s left"; return; fi
  step "$name" timeout $(( $(left) - 5 )) python3 benchmarks/with_settings.py "$@" -- bench llm "${COMMON[@]}" \
    --batch 16,32 --quant int4@triton --out "$R/$name"
}
T=kiln.kernels.triton_rows
one d1 $T.PROGRAMS_PER_SM=2
one bm32 $T.DECODE_BLOCK_M=32
one bn256 $T.DECODE_BLOCK_N=256 $T.DECODE_WARPS=8
one bm32w8 $T.DECODE_BLOCK_M=32 $T.DECODE_WARPS=8
one d2 $T.PROGRAMS_PER_SM=2
one bm32b $T.DECODE_BLOCK_M=32
one bn256b $T.DECODE_BLOCK_N=256 $T.DECODE_WARPS=8
python3 - "$R" <<'PY'
import json, sys, pathlib
for t in ("d1", "bm32", "bn256", "bm32w8", "d2", "bm32b", "bn256b"):
    p = pathlib.Path(sys.argv[1]) / t / "results.json"
    if p.exists():
        d = json.loads(p.read_text())
        print(t, [(r["batch"], r.get("quant"), round(r["decode_step_ms"], 4)) for r in d["results"]])
PY
find "$R" -name "*.png" -delete
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
