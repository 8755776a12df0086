#!/bin/bash
# Where batch-1 decode loses to the bandwidth roofline (issue 11), on the device machine from the
# repo root:   bash benchmarks/gpu_decode.sh      (~6-7 min on one H100)
#
# (1) `kiln bench llm` on the Llama-3.2-3B shape (bf16, batch 1, prompt 1024, 256 new tokens) with
#     hf-compiled beside kiln-compiled (the plain recipe in the same table) and --profile-decode 64:
#     kernels per step, GPU idle between kernels, bandwidth while busy, and the verdict. Prefill
#     eager and tuning for decode only, so kiln's warm-up is one decode compile (~2 min); hf-compiled
#     ~75 s compile.
# (2) the same kiln-compiled row with inductor's programmatic dependent launch
#     (`--inductor triton.enable_pdl=true`, Hopper+): whether overlapping each kernel's start with
#     the previous kernel's tail closes the gaps (1) measures. ~2.5 min.
# Writes $OUT/r/<name>/results.{json,md,png} and decode_profile/ with logs; packs $OUT/results.tgz.
set -uo pipefail
source benchmarks/gpu_env.sh
start=$(date +%s)
source benchmarks/gpu_step.sh
COMMON=(--model llama-3.2-3b --prompt-len 1024 --new-tokens 256 --prefill eager --tuning decode --repeats 3
        --profile-decode 64)
step decode_3b timeout 330 python3 -m kiln bench llm "${COMMON[@]}" --engines hf-compiled,kiln-compiled --out "$R/decode_3b"
step decode_3b_pdl timeout 300 python3 -m kiln bench llm "${COMMON[@]}" --engines kiln-compiled \
  --inductor triton.enable_pdl=true --out "$R/decode_3b_pdl"
echo "=== done in $(( $(date +%s) - start )) s"
tar czf "$OUT/results.tgz" -C "$R" .
