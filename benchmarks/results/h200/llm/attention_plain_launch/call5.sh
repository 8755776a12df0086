#!/bin/bash
# Call 5: kiln serve, int4@triton, greedy at 1 and 32 streams (32-row server, buckets 1,32, 4 client processes),
# this tree (HEAD: the one-chunk decode attention launched plainly) then 281230b (.b53/basetree), each with its own
# compile cache.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
cp .b53/commit.txt "$R/commit.txt"
SITE=${PYTHONPATH#*:}
SERVE=(CONCURRENCY=1,32 DURATION_S=6 OPEN_FRACTIONS=" " MAX_BATCH=32 BATCH_BUCKETS=1,32 PART=int4 CLIENT_PROCS=4 TEMPERATURE=0)
NEWC=(TRITON_CACHE_DIR=/tmp/cn/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cn/inductor)
BASEC=(TRITON_CACHE_DIR=/tmp/cb/triton TORCHINDUCTOR_CACHE_DIR=/tmp/cb/inductor)
rm -rf .b53/basetree/benchmarks && cp -r benchmarks .b53/basetree/
env "${SERVE[@]}" "${NEWC[@]}" TAG=new PART_S=140 BUDGET_S=145 bash benchmarks/serve.sh
( cd .b53/basetree && env "${SERVE[@]}" "${BASEC[@]}" TAG=base PART_S=140 BUDGET_S=145 OUT="$OUT" PYTHONPATH="$SITE" bash benchmarks/serve.sh )
grep -h "^| int4" "$R/summary.md"
find "$R" -name "*.png" -delete
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
