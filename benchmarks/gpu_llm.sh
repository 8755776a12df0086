#!/bin/bash
# GPU evidence for kiln's LLM engine (issue 11), run on the device machine from the repo root:
#
#   bash benchmarks/gpu_llm.sh           # full, ~6-7 min on one H100 (budget below)
#   SMOKE=1 bash benchmarks/gpu_llm.sh   # smoke, ~2-3 min: 1B shape, kiln engines only, 64 new tokens
#
# Full: (1) kiln vs transformers logits and fp32 greedy tokens on the Llama-3.2-3B shape with
# identical random weights (benchmarks/llm_parity.py, ~40 s); (2) `kiln bench llm --preset
# seed002-llama3b`: hf-eager, hf-compiled, kiln-eager, kiln-compiled on the 3B shape, bf16, batch 1,
# prompt 1024, 256 new tokens, in one process. Budget of (2): ceilings + models ~20 s; hf-eager
# ~35 tok/s, so 1 + 1 warm-up + 3 timed requests ~40 s; hf-compiled ~75 s compile (BASELINES) + 5
# requests ~10 s; kiln-eager ~10 s; kiln-compiled ~2 min (decode + one prefill bucket compiled,
# coordinate-descent tuning) + requests ~4 s; prefill timing ~2 s.
# Smoke: the parity check on the 1B shape, then kiln-eager/kiln-compiled on the 1B shape (prompt
# 1024, 64 new tokens): catches GPU-only failures (CUDA graph capture, Triton kernels) cheaply.
# Writes $OUT/r/<name>/results.{json,md,png} with logs and nvidia-smi.csv; packs $OUT/results.tgz.
set -uo pipefail
source benchmarks/gpu_env.sh
start=$(date +%s)
source benchmarks/gpu_step.sh
if [ "${SMOKE:-0}" = "1" ]; then
  step llm_parity_1b python3 benchmarks/llm_parity.py --model llama-3.2-1b --greedy-steps 16 --out "$R/llm_parity_1b"
  step bench_llm_smoke_1b python3 -m kiln bench llm --model llama-3.2-1b --engines kiln-eager,kiln-compiled \
    --prompt-len 1024 --new-tokens 64 --repeats 2 --out "$R/bench_llm_smoke_1b"
else
  step llm_parity_3b python3 benchmarks/llm_parity.py --model llama-3.2-3b --out "$R/llm_parity_3b"
  step bench_llm_seed002_llama3b python3 -m kiln bench llm --preset seed002-llama3b --out "$R/bench_llm_seed002_llama3b"
fi
echo "=== done in $(( $(date +%s) - start )) s"
tar czf "$OUT/results.tgz" -C "$R" .
