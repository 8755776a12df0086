#!/bin/bash
# Scaling on a multi-GPU device machine (run from the repo root), through `kiln bench scale`:
# kiln's ViT-B/16, bf16-mixed, torch.compile default, batch 64 per GPU (weak scaling), DDP and
# FSDP2 (kiln's defaults) at each rank count in $NPROCS (default 1,2,4,8; counts above the visible
# GPUs become `skipped` rows), NCCL collectives at the model's bucket and unit sizes on the largest
# rank count, and predictions to 1024 GPUs with their error against every measured point.
# Extra variants: VARIANTS="--variant fsdp-prefetch=fsdp,distributed.fsdp_forward_prefetch=1 ...".
# Expected on 8 GPUs: ~6 min (1 + 2 x 4 points, ~35 s each; the bandwidth step ~30 s).
# Writes $OUT/scale/{results.json,results.md,results.png,points/*,comm/*}, $OUT/topo.txt.
set -uo pipefail
NPROCS=${NPROCS:-1,2,4,8}
STEPS=${STEPS:-60}
read -r -a VARIANT_ARGS <<< "${VARIANTS:-}"
source benchmarks/gpu_env.sh
cp "$R/nvidia-smi.csv" "$OUT/nvidia-smi.csv"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
echo "=== kiln bench scale --nprocs $NPROCS ($(date +%T))"
python3 -m kiln bench scale --config configs/vit_b16.toml --nprocs "$NPROCS" --strategies ddp,fsdp "${VARIANT_ARGS[@]}" \
  --steps "$STEPS" --timeout 240 --out "$OUT/scale" 2>&1 | tee "$OUT/scale.log" | tail -40
echo "=== done ($(date +%T))"
