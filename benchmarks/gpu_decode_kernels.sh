#!/bin/bash
# The Triton decode attention and inductor's tuning of the decode step, on one GPU in one call
# (~7-8 min on an H100):
#   bash benchmarks/gpu_decode_kernels.sh
# 1. benchmarks/decode_attention_bench.py: one layer's decode attention (3B shape, 1280 slots) for
#    the compiled matmul path, FlashAttention's varlen kernel and the Triton kernel over a sweep of
#    its launch settings (~1 min).
# 2. kiln bench llm, Llama-3.2-3B shape (bf16, batch 1, prompt 1024, 256 new tokens), kiln-compiled
#    with --decode-attention triton at quant none and int4, with a profile of 32 decode steps.
# 3. The bf16 row again with a wider coordinate-descent search (radius 2, all directions checked):
#    inductor's tuning of the matrix-vector kernels differs between compiles by several %, and a
#    wider search may find better configurations (more compile time).
# Writes $OUT/r/<name>/... and logs; packs $OUT/kernels.tgz after each part.
set -uo pipefail
source benchmarks/gpu_env.sh
start=$(date +%s)
source benchmarks/gpu_step.sh
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
pack() { tar czf "$OUT/kernels.tgz" -C "$R" .; }
C=(--model llama-3.2-3b --prompt-len 1024 --new-tokens 256 --prefill eager --repeats 3 --engines kiln-compiled
   --decode-attention triton)
step attn_bench timeout 150 python3 benchmarks/decode_attention_bench.py --out "$R/attn_bench"
pack
step bench_triton timeout 300 python3 -m kiln bench llm "${C[@]}" --quant none,int4 --profile-decode 32 \
  --deadline-s 200 --out "$R/bench_triton"
pack
step bench_wide_tuning timeout $(( 570 - ($(date +%s) - start) )) python3 -m kiln bench llm "${C[@]}" --quant none \
  --inductor coordinate_descent_check_all_directions=true --inductor coordinate_descent_search_radius=2 \
  --deadline-s 60 --out "$R/bench_wide_tuning"
python3 benchmarks/llm_rows.py "$R"
echo "=== done in $(( $(date +%s) - start )) s"
pack
