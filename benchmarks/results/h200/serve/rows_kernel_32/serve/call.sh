#!/bin/bash
# Call 3: A/B of the H200 row-kernel table (this tree) against the commit before it (.b51/basetree),
# kiln serve greedy at 1 and 32 streams (32-row server, buckets 1,32, 4 client processes), new / base / new,
# each tree with its own compile cache; then kiln bench llm batch 1,32 new and base if time allows.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
cp .b51/commit.txt "$R/commit.txt"
SITE=${PYTHONPATH#*:}
left() { echo $(( 560 - ($(date +%s) - start) )); }
SERVE=(CONCURRENCY=1,32 DURATION_S=8 OPEN_FRACTIONS=" " MAX_BATCH=32 BATCH_BUCKETS=1,32 PART=bf16 CLIENT_PROCS=4 TEMPERATURE=0)
NEWC=(TRITON_CACHE_DIR=/tmp/cn/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cn/inductor)
BASEC=(TRITON_CACHE_DIR=/tmp/cb/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cb/inductor)
rm -rf .b51/basetree/benchmarks && cp -r benchmarks .b51/basetree/
env "${SERVE[@]}" "${NEWC[@]}" TAG=new PART_S=150 BUDGET_S=155 bash benchmarks/serve.sh
( cd .b51/basetree && env "${SERVE[@]}" "${BASEC[@]}" TAG=base PART_S=150 BUDGET_S=155 OUT="$OUT" PYTHONPATH="$SITE" bash benchmarks/serve.sh )
env "${SERVE[@]}" "${NEWC[@]}" TAG=new2 PART_S=100 BUDGET_S=105 bash benchmarks/serve.sh
grep -h "^| bf16" "$R/summary.md"
grep -h "warm-up done" "$R"/*.server.log
LLM=(bench llm --model llama-3.2-3b --quant none --batch 1,32 --prompt-len 512 --new-tokens 128 --tuning decode
     --prefill eager --repeats 3 --engines kiln-compiled)
if [ "$(left)" -gt 75 ]; then
  step llm_new timeout $(( $(left) - 5 )) env "${NEWC[@]}" python3 -m kiln "${LLM[@]}" --out "$R/llm_new"
fi
if [ "$(left)" -gt 75 ]; then
  step llm_base timeout $(( $(left) - 5 )) env "${BASEC[@]}" PYTHONPATH="$PWD/.b51/basetree/src:$SITE" python3 -m kiln "${LLM[@]}" --out "$R/llm_base"
fi
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
