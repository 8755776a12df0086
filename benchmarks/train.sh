#!/bin/bash
# The trainer on one GPU: `kiln train` of the shipped configs and kiln's trainer against a hand-written
# loop with the same settings, from the repo root of the device machine:
#   PART=core bash benchmarks/train.sh            # several parts comma-separated run one after the other
# Parts (time on one H100):
#   core          `kiln env --json`; `kiln train --config configs/seed_production.toml` (seed MLP b128
#                 bf16-mixed reduce-overhead, 2000 steps); benchmarks/trainer_overhead.py for the seed MLP
#                 (3 alternating rounds x 400 steps) and ViT-B/16 (2 rounds x 80 steps); timm's
#                 ViT-B/16 through kiln (40 steps) -> results/h100/{env.json, train_seed_production,
#                 trainer_overhead_seed_mlp, train_timm_vit_b16} (~5 min); $OUT/r/log.txt holds every log
#   overhead-vit  benchmarks/trainer_overhead.py on kiln's ViT-B/16 b64 bf16 compiled, 4 alternating
#                 rounds x 100 steps -> results/h100/trainer_overhead_vit_b16 (~3 min)
# LLM training against the plain transformers loop and torchtitan is benchmarks/train_llm.sh; the
# real-text model is benchmarks/llm_real_text.sh; checkpoint and failure behaviour are health.sh's.
# Writes everything under $OUT/r and packs it as $OUT/results.tgz.
set -uo pipefail
VALID="core overhead-vit"
for part in ${PART//,/ }; do
  [[ " $VALID " == *" $part "* ]] || { echo "train.sh: unknown PART '$part' (${VALID// /, })" >&2; exit 2; }
done
[ -n "${PART:-}" ] || { echo "train.sh: PART is required (${VALID// /, })" >&2; exit 2; }
source benchmarks/device_env.sh  # $OUT/r as $R, carried wheels, PYTHONPATH, nvidia-smi.csv
run() { echo "=== $* ($(date +%T))"; "$@" 2>&1 | tee -a "$R/log.txt" | tail -4; }

core() {
  python3 -m kiln env --json > "$R/env.json"
  run python3 -m kiln train --config configs/seed_production.toml --run-dir "$R/seed_production" metrics.console=false
  run python3 benchmarks/trainer_overhead.py --config configs/seed_production.toml --steps 400 --rounds 3 \
    --name seed_mlp_b128_bf16_reduce_overhead --out "$R/overhead_seed_mlp"
  run python3 benchmarks/trainer_overhead.py --config configs/vit_b16.toml --steps 80 --interval 10 --rounds 2 \
    --name vit_b16_b64_bf16_compile --out "$R/overhead_vit_b16"
  run python3 -m kiln train --config configs/vit_b16.toml --run-dir "$R/timm_vit_b16" \
    'model.name=timm:vit_base_patch16_224' 'model.kwargs={}' training.steps=40 metrics.console=false
}

for part in ${PART//,/ }; do
  case $part in
    core) core ;;
    overhead-vit) run python3 benchmarks/trainer_overhead.py --config configs/vit_b16.toml --steps 100 --interval 10 \
                    --rounds 4 --name vit_b16_b64_bf16_compile --out "$R/overhead_vit_b16" ;;
  esac
  tar czf "$OUT/results.tgz" -C "$R" .
done
