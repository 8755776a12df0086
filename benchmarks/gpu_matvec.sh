#!/bin/bash
# kiln's fused decode matrix-vector kernel (kiln.llm.triton_matvec, --decode-matvec triton) on one
# GPU in one call (~7 min on an H100):
#   bash benchmarks/gpu_matvec.sh
# 1. benchmarks/matvec_bench.py: per projection of the 3B shape with its fused work, against
#    inductor's fused reductions and cuBLAS; then all layers' projections chained in one CUDA
#    graph, with and without programmatic dependent launch (~2 min; INT4=1 adds int4 rows).
# 2. kiln bench llm, Llama-3.2-3B shape (bf16, batch 1, prompt 1024, 256 new tokens), kiln-compiled,
#    once per --decode-matvec in ${MATVECS:-triton inductor}, quant ${QUANT:-none}, each with a
#    profile of 32 decode steps.
# Writes $OUT/r/... and packs $OUT/matvec.tgz after each part.
set -uo pipefail
source benchmarks/gpu_env.sh
start=$(date +%s)
source benchmarks/gpu_step.sh
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
pack() { tar czf "$OUT/matvec.tgz" -C "$R" .; }
if [ "${MICRO:-1}" = 1 ]; then
  step matvec timeout 240 python3 benchmarks/matvec_bench.py $([ "${INT4:-0}" = 1 ] && echo --int4) --out "$R/matvec"
  pack
fi
for m in ${MATVECS:-triton inductor}; do
  step "bench_$m" timeout $(( 580 - ($(date +%s) - start) )) python3 -m kiln bench llm --model llama-3.2-3b \
    --prompt-len 1024 --new-tokens 256 --prefill eager --repeats 3 --engines kiln-compiled --decode-attention triton \
    --decode-matvec "$m" --quant "${QUANT:-none}" --profile-decode 32 --deadline-s 400 --out "$R/bench_matvec_$m"
  pack
done
python3 benchmarks/llm_rows.py "$R" --glob 'bench_matvec_*/results.json'
echo "=== done in $(( $(date +%s) - start )) s"
pack
