#!/bin/bash
# Call 4: kiln bench llm bf16 batch 1 and 16, three processes of this tree one after another (the first
# cold, the next two on its compile cache): is the batch-16 step within 1.25x batch 1's in each?
set -u
start=$(date +%s)
source benchmarks/device_env.sh
cp .b51/commit.txt "$R/commit.txt"
export TRITON_CACHE_DIR=/tmp/c/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c/inductor
left() { echo $(( 265 - ($(date +%s) - start) )); }
LLM=(bench llm --model llama-3.2-3b --quant none --batch 1,16 --prompt-len 512 --new-tokens 128 --tuning decode
     --prefill eager --repeats 5 --engines kiln-compiled)
for p in 1 2 3; do
  need=$([ $p = 1 ] && echo 100 || echo 50)
  if [ "$(left)" -lt "$need" ]; then echo "=== p$p: skipped, $(left) s left"; continue; fi
  step p$p timeout $(( $(left) - 3 )) python3 -m kiln "${LLM[@]}" --out "$R/p$p"
done
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
