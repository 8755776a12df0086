#!/bin/bash
# Call 1: where the int4@triton batch-16 step goes, beside bf16's, in one process (--profile-decode).
set -u
start=$(date +%s)
source benchmarks/device_env.sh
cp .b53/commit.txt "$R/commit.txt"
export TRITON_CACHE_DIR=/tmp/c/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c/inductor
left() { echo $(( 500 - ($(date +%s) - start) )); }
step prof timeout $(( $(left) - 20 )) python3 -m kiln bench llm --model llama-3.2-3b --prompt-len 512 --new-tokens 128 \
  --tuning decode --prefill eager --repeats 5 --engines kiln-compiled --batch 1,16 --quant none,int4@triton --profile-decode 16 \
  --out "$R/prof"
find "$R/prof" -name "*.json" -size +3M -delete 2>/dev/null
ls -la "$R/prof" | head -40
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
