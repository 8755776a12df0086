#!/bin/bash
# Decode on one GPU with the fused decode kernels (RoPE + cache write + attention in one launch,
# the matrix-vector kernel with 2-D tiles), in one call (~8 min on an H100):
#   bash benchmarks/gpu_decode_fused.sh
# 1. seed 002's table (`kiln bench llm --preset seed002-llama3b`: hf-eager, hf-compiled, kiln-eager,
#    kiln-compiled; Llama-3.2-3B shape, bf16, batch 1, prompt 1024, 256 new tokens) with
#    --decode-matvec ${MATVEC:-triton} and a profile of 32 decode steps.
# 2. kiln-compiled with --decode-matvec inductor at quant ${QUANT:-none,int4} (int4: torchao's
#    tinygemm), the int4/bf16 ratio within one process.
# Writes $OUT/r/... and packs $OUT/decode.tgz after each part.
set -uo pipefail
source benchmarks/gpu_env.sh
start=$(date +%s)
source benchmarks/gpu_step.sh
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
pack() { tar czf "$OUT/decode.tgz" -C "$R" .; }
step seed002 timeout 330 python3 -m kiln bench llm --preset seed002-llama3b --decode-matvec "${MATVEC:-triton}" \
  --profile-decode 32 --deadline-s 300 --out "$R/seed002"
pack
step quant timeout $(( 570 - ($(date +%s) - start) )) python3 -m kiln bench llm --model llama-3.2-3b \
  --prompt-len 1024 --new-tokens 256 --prefill eager --repeats 3 --engines kiln-compiled --decode-matvec inductor \
  --quant "${QUANT:-none,int4}" --profile-decode 32 --deadline-s 200 --out "$R/quant_inductor"
python3 benchmarks/llm_rows.py "$R"
echo "=== done in $(( $(date +%s) - start )) s"
pack
