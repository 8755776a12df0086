#!/bin/bash
# Call 5 (call 4 again; its read floor failed: outputs freed under their graphs): the read floor of the 3B batch-1 decode step's structure (benchmarks/read_floor.py), bf16 and int4,
# then kiln's own batch-1 steps in the same call, with a decode profile (exclusive time per kernel).
set -u
start=$(date +%s)
source benchmarks/device_env.sh
export TRITON_CACHE_DIR=/tmp/c/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c/inductor
step floor timeout 240 python3 benchmarks/read_floor.py --out "$R/floor"
step bench timeout 300 python3 -m kiln bench llm --model llama-3.2-3b --prompt-len 512 --new-tokens 128 --tuning decode \
  --prefill eager --repeats 5 --engines kiln-compiled --batch 1 --quant none,int4@triton --profile-decode 16 --out "$R/bench"
find "$R" -name "*.png" -delete; find "$R" -name "*.json.gz" -delete
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
