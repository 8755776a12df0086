#!/bin/bash
# Scaling evidence for DDP and FSDP2 (run on a multi-GPU device machine from the repo root):
# kiln's ViT-B/16, bf16-mixed, compiled, batch 64 per GPU (weak scaling), through
# `kiln train --nproc-per-node N`, for N in 1 and each of $WORLDS (default "2 4").
# Writes $OUT/r/<run>/ (summary, metrics), $OUT/r/scale/results.{json,md}; packs $OUT/results.tgz.
set -uo pipefail
WORLDS=${WORLDS:-2 4}
STEPS=${STEPS:-60}
source benchmarks/gpu_env.sh
nvidia-smi topo -m > "$R/topo.txt" 2>&1
common=(--config configs/vit_b16.toml training.steps=$STEPS training.log_interval=10 metrics.console=false
        checkpoint.save_final=false)
run() {  # name nproc overrides...
  local name=$1 n=$2; shift 2
  echo "=== $name ($(date +%T))"
  timeout 240 python3 -m kiln train --nproc-per-node "$n" --run-dir "$R/$name" "${common[@]}" "$@" \
    > "$R/$name.log" 2>&1 || echo "FAILED: see $name.log"
  grep "^kiln: completed" "$R/$name.log" | head -1
}
run vit_w1 1
runs=("$R/vit_w1")
for n in $WORLDS; do
  run "vit_ddp_w$n" "$n" distributed.strategy=ddp; runs+=("$R/vit_ddp_w$n")
  run "vit_fsdp_w$n" "$n" distributed.strategy=fsdp; runs+=("$R/vit_fsdp_w$n")
done
python3 benchmarks/scale_table.py --title "kiln ViT-B/16 bf16 compiled, batch 64 per GPU" --out "$R/scale" "${runs[@]}"
tar czf "$OUT/results.tgz" -C "$R" .
