#!/bin/bash
# Call 2: int4 row kernel, eight K=16 dots against one K=128 dot (probe kernel), 16 and 32 rows.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
export TRITON_CACHE_DIR=/tmp/c/triton
step probe timeout 300 python3 .b52/rows_probe.py 16,32
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
