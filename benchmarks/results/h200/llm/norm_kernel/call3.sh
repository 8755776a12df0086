#!/bin/bash
# Call 3: where the bf16 batch-16 step goes now (kiln bench llm --profile-decode), and ncu of the
# decode attention at batch 16 and 32.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null || true
export TRITON_CACHE_DIR=/tmp/c/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c/inductor
left() { echo $(( 420 - ($(date +%s) - start) )); }
NCU=/usr/local/cuda/bin/ncu
for b in 16 32; do
  step ncu_attn$b timeout 90 $NCU --clock-control none --kernel-name regex:_chunk_attention --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    python3 .b52/attn_ncu.py $b
done
echo "=== left $(left) s"
step prof timeout $(( $(left) - 20 )) python3 -m kiln bench llm --model llama-3.2-3b --prompt-len 512 --new-tokens 128 \
  --tuning decode --prefill eager --repeats 5 --engines kiln-compiled --batch 1,16 --quant none --profile-decode 16 \
  --out "$R/prof"
find "$R/prof" -name "*.json" -size +3M -delete 2>/dev/null
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
