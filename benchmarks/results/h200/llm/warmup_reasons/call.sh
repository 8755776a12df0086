#!/bin/bash
# Call 3 (as call 2, with the kernels compiled named and the trace and inductor seconds): warm-up and why (kiln.compile_cache.cache_use: graphs and Triton kernels compiled or loaded), 3B shape:
# a cold `kiln bench llm` process (bf16 and int4@triton, batch 1 and 16), the same again on its caches, one with a
# row-kernel launch setting changed; `kiln generate` int4 cold then warm.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null || true
export TRITON_CACHE_DIR=/tmp/c/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c/inductor
COMMON=(--model llama-3.2-3b --prompt-len 512 --new-tokens 128 --tuning decode --prefill eager --repeats 3
        --engines kiln-compiled)
step cold timeout 230 python3 -m kiln bench llm "${COMMON[@]}" --batch 1,16 --quant none,int4@triton --out "$R/cold"
step warm timeout 150 python3 -m kiln bench llm "${COMMON[@]}" --batch 1,16 --quant none,int4@triton --out "$R/warm"
step setting timeout 120 python3 benchmarks/with_settings.py kiln.kernels.triton_rows.PROGRAMS_PER_SM=4 -- bench llm \
  "${COMMON[@]}" --batch 16 --quant int4@triton --out "$R/setting"
for g in gen1 gen2; do
  step $g timeout 90 python3 -m kiln generate --model llama-3.2-3b --tokens 1,2,3,4,5 --max-new-tokens 32 \
    --quant int4 --quant-backend triton --json "$R/$g.json"
done
find "$R" -name "*.png" -delete
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
