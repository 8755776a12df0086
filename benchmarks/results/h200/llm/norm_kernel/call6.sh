#!/bin/bash
# Call 6: A/B of the norm kernel (this tree) against 018ff85 (.b52/basetree) through kiln serve, greedy at 1 and
# 32 streams (32-row server, buckets 1,32, 4 client processes), new / base / new, each tree with its own compile cache.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
cp .b52/commit.txt "$R/commit.txt"
SITE=${PYTHONPATH#*:}
SERVE=(CONCURRENCY=1,32 DURATION_S=8 OPEN_FRACTIONS=" " MAX_BATCH=32 BATCH_BUCKETS=1,32 PART=bf16 CLIENT_PROCS=4 TEMPERATURE=0)
NEWC=(TRITON_CACHE_DIR=/tmp/cn/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cn/inductor)
BASEC=(TRITON_CACHE_DIR=/tmp/cb/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cb/inductor)
rm -rf .b52/basetree/benchmarks && cp -r benchmarks .b52/basetree/
env "${SERVE[@]}" "${NEWC[@]}" TAG=new PART_S=150 BUDGET_S=155 bash benchmarks/serve.sh
( cd .b52/basetree && env "${SERVE[@]}" "${BASEC[@]}" TAG=base PART_S=150 BUDGET_S=155 OUT="$OUT" PYTHONPATH="$SITE" bash benchmarks/serve.sh )
env "${SERVE[@]}" "${NEWC[@]}" TAG=new2 PART_S=100 BUDGET_S=105 bash benchmarks/serve.sh
grep -h "^| bf16" "$R/summary.md"
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
