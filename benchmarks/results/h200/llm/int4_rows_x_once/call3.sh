#!/bin/bash
# Call 3: kiln serve, int4@triton, greedy at 1 and 32 streams (32-row server, buckets 1,32, 4 client processes),
# this tree (HEAD: the int4 row kernel with SWAP_X_ONCE and SWAP_SCALES_AHEAD on) then 4ab1650 (.b54/basetree),
# each with its own compile cache; then, time left, a profile of this tree's int4@triton batch-16 decode step.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
cp .b54/commit.txt "$R/commit.txt"
SITE=${PYTHONPATH#*:}
SERVE=(CONCURRENCY=1,32 DURATION_S=6 OPEN_FRACTIONS=" " MAX_BATCH=32 BATCH_BUCKETS=1,32 PART=int4 CLIENT_PROCS=4 TEMPERATURE=0)
NEWC=(TRITON_CACHE_DIR=/tmp/cn/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cn/inductor)
BASEC=(TRITON_CACHE_DIR=/tmp/cb/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cb/inductor)
rm -rf .b54/basetree/benchmarks && cp -r benchmarks .b54/basetree/
env "${SERVE[@]}" "${NEWC[@]}" TAG=new PART_S=140 BUDGET_S=145 bash benchmarks/serve.sh
( cd .b54/basetree && env "${SERVE[@]}" "${BASEC[@]}" TAG=base PART_S=140 BUDGET_S=145 OUT="$OUT" PYTHONPATH="$SITE" bash benchmarks/serve.sh )
grep -h "^| int4" "$R/summary.md"
if [ $(( 560 - ($(date +%s) - start) )) -gt 100 ]; then
  step profile env "${NEWC[@]}" timeout $(( 550 - ($(date +%s) - start) )) python3 -m kiln bench llm --model llama-3.2-3b \
    --prompt-len 512 --new-tokens 128 --tuning decode --prefill eager --repeats 3 --engines kiln-compiled --batch 16 \
    --quant int4@triton --profile-decode 16 --out "$R/profile"
fi
find "$R" -name "*.png" -delete
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
