#!/bin/bash
# kiln's Triton int4 matmul (int4@triton) against tinygemm (torchao's int4), on one GPU in one call
# (~3.5 min on an H100):
#   bash benchmarks/gpu_int4.sh
# 1. benchmarks/int4_matvec_bench.py: one-token matmuls per projection of the 3B shape (~1-2 min,
#    the Triton kernel autotunes per shape on its first call).
# 2. kiln bench llm, Llama-3.2-3B shape (bf16, batch 1, prompt 1024, 256 new tokens),
#    kiln-compiled with --decode-attention triton and --decode-matvec ${MATVEC:-triton} at quant
#    ${QUANT:-none,int4@triton,int4} (int4: torchao's), with a profile of 32 decode steps per row;
#    RUNS times (default 1), each in its own process. SKIP_MATVEC=1 skips part 1.
# Writes $OUT/r/<name>/... and logs; packs $OUT/int4.tgz after each part.
set -uo pipefail
source benchmarks/gpu_env.sh
start=$(date +%s)
source benchmarks/gpu_step.sh
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
pack() { tar czf "$OUT/int4.tgz" -C "$R" .; }
# CUDA_LAUNCH_BLOCKING: the first run died of an illegal address somewhere in the replays; name the kernel.
[ -n "${SKIP_MATVEC:-}" ] || step int4_matvec env CUDA_LAUNCH_BLOCKING=1 timeout 180 python3 benchmarks/int4_matvec_bench.py --out "$R/int4_matvec"
pack
# RUNS=2: the bench in two processes, same call (int4@triton's autotuned settings are kept in
# Triton's cache, so the later processes take the first one's).
runs=${RUNS:-1}
for i in $(seq 1 "$runs"); do
  name=bench_int4; [ "$runs" -gt 1 ] && name=bench_int4_$i
  left=$(( 575 - ($(date +%s) - start) ))
  step $name timeout $left python3 -m kiln bench llm --model llama-3.2-3b \
    --prompt-len 1024 --new-tokens 256 --prefill eager --repeats 3 --engines kiln-compiled --decode-attention triton \
    --decode-matvec "${MATVEC:-triton}" --quant "${QUANT:-none,int4@triton,int4}" --profile-decode 32 \
    --deadline-s $(( left / (runs - i + 1) - 40 )) --out "$R/$name"
  pack
done
python3 benchmarks/llm_rows.py "$R"
echo "=== done in $(( $(date +%s) - start )) s"
pack
