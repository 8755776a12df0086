#!/bin/bash
# GPU evidence for the core trainer (run on the device machine from the repo root):
#   kiln env; `kiln train --config configs/seed_production.toml`; trainer overhead against a
#   hand-written loop for the seed MLP and ViT-B/16; timm's ViT-B/16 through kiln.
# Writes everything under $OUT/r and packs it as $OUT/results.tgz.
set -uo pipefail
source benchmarks/gpu_env.sh
step() { echo "=== $* ($(date +%T))"; "$@" 2>&1 | tee -a "$R/log.txt" | tail -4; }
python3 -m kiln env --json > "$R/env.json"
step python3 -m kiln train --config configs/seed_production.toml --run-dir "$R/seed_production" metrics.console=false
step python3 benchmarks/trainer_overhead.py --config configs/seed_production.toml --steps 400 --rounds 3 \
  --name seed_mlp_b128_bf16_reduce_overhead --out "$R/overhead_seed_mlp"
step python3 benchmarks/trainer_overhead.py --config configs/vit_b16.toml --steps 80 --interval 10 --rounds 2 \
  --name vit_b16_b64_bf16_compile --out "$R/overhead_vit_b16"
step python3 -m kiln train --config configs/vit_b16.toml --run-dir "$R/timm_vit_b16" \
  'model.name=timm:vit_base_patch16_224' 'model.kwargs={}' training.steps=40 metrics.console=false
tar czf "$OUT/results.tgz" -C "$R" .
