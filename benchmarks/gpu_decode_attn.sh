#!/bin/bash
# Decode attention kernels (kiln.llm.decode_attention) on one GPU, in one call (~9 min on an H100):
#   bash benchmarks/gpu_decode_attn.sh                      # KERNELS="triton matmul" (default)
#   KERNELS="flash matmul" bash benchmarks/gpu_decode_attn.sh
#   ENGINES=kiln-compiled,hf-compiled QUANT=none,int4 ...   # the rows of each bench (default: kiln-compiled)
# 1. benchmarks/decode_attention_check.py: matmul, flash and triton on the 3B attention shape (4
#    layers), a left-padded batch of 3, eager steps against an fp32 copy (the compiled engines are
#    left to step 2, whose rows count greedy tokens against the eager model).
# 2. kiln bench llm on the Llama-3.2-3B shape (bf16, batch 1, prompt 1024, 256 new tokens),
#    kiln-compiled at quant none and int4 with the first of KERNELS, and a profile of 32 replayed
#    decode steps per row (kernels, gaps, bandwidth while busy) (~4-5 min cold).
# 3. The same rows with each further kernel, shorter: inductor's caches from (2) serve every kernel
#    they share (~2-3 min); started only while the call has > 90 s left, cut at its end.
# Writes $OUT/r/<name>/... and logs; packs $OUT/decode_attn.tgz after each part.
set -uo pipefail
source benchmarks/gpu_env.sh
start=$(date +%s)
source benchmarks/gpu_step.sh
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
read -r -a kernels <<< "${KERNELS:-triton matmul}"
left() { echo $(( ${1} - ($(date +%s) - start) )); }  # left BUDGET_S: seconds of it not yet spent
pack() { tar czf "$OUT/decode_attn.tgz" -C "$R" .; }
COMMON=(--model llama-3.2-3b --prompt-len 1024 --new-tokens 256 --prefill eager --repeats 3
        --engines "${ENGINES:-kiln-compiled}" --quant "${QUANT:-none,int4}")
step check timeout 120 python3 benchmarks/decode_attention_check.py --compiled "" --out "$R/decode_attention_check"
pack
step "bench_${kernels[0]}" timeout 320 python3 -m kiln bench llm "${COMMON[@]}" --decode-attention "${kernels[0]}" \
  --profile-decode 32 --deadline-s 200 --out "$R/bench_${kernels[0]}"
pack
for kernel in "${kernels[@]:1}"; do
  cap=$(left 570)
  if [ "$cap" -gt 90 ]; then
    step "bench_$kernel" timeout "$cap" python3 -m kiln bench llm "${COMMON[@]}" --decode-attention "$kernel" \
      --deadline-s $(( cap - 80 )) --out "$R/bench_$kernel"
    pack
  fi
done
python3 benchmarks/llm_rows.py "$R"
echo "=== done in $(( $(date +%s) - start )) s"
pack
