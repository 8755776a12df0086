#!/bin/bash
# Second readings, one call on one H100 (~9 min), of what the stop's first calls measured:
#   bash benchmarks/gpu_confirm.sh
# 1. benchmarks/decode_attention_check.py: the decode attention paths (matmul, flash, triton: now
#    RoPE + cache write + attention in one kernel) against an fp32 copy, eager, then compiled
#    engines (with the default --decode-matvec auto, i.e. kiln's matrix-vector kernel).
# 2. kiln bench llm, seed 002's shape, hf-compiled beside kiln-compiled with every default (decode
#    attention and matrix-vector kernels `auto`).
# 3. kiln bench scale at one rank, ddp and fsdp points alternated twice each (one torchrun
#    job per point, as kiln train runs them): the spread of sequential points.
# Writes $OUT/r/... and packs $OUT/confirm.tgz after each part.
set -uo pipefail
source benchmarks/gpu_env.sh
start=$(date +%s)
source benchmarks/gpu_step.sh
pack() { tar czf "$OUT/confirm.tgz" -C "$R" .; }
step attention_check timeout 150 python3 benchmarks/decode_attention_check.py --out "$R/attention_check"
pack
step seed002 timeout 230 python3 -m kiln bench llm --preset seed002-llama3b --engines hf-compiled,kiln-compiled \
  --deadline-s 200 --out "$R/seed002"
pack
step scale timeout $(( 585 - ($(date +%s) - start) )) python3 -m kiln bench scale --config configs/vit_b16.toml \
  --nprocs 1 --strategies ddp,fsdp --variant ddp-2=ddp,distributed.ddp_bucket_cap_mb=25 \
  --variant fsdp-2=fsdp,distributed.fsdp_one_rank_fused_copy=true --steps 60 --timeout 90 --out "$R/scale_alternating"
echo "=== done in $(( $(date +%s) - start )) s"
pack
