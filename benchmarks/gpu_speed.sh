#!/bin/bash
# GPU evidence for "faster than a user's own torch.compile" (whole-step capture, the step scope,
# regional compile, compile caches, plain baselines), run on the device machine from the repo root:
#   PARTS="mlp train vit" bash benchmarks/gpu_speed.sh
# Parts (each a `kiln bench compile` or `kiln train` call, capped by TIMEOUT seconds):
#   mlp       seed MLP b128 fp32+bf16 (seed000-levels): eager, whole-step capture, regional, reduce-overhead,
#             plain hand loops (eager, default, reduce-overhead), cold and warm compile
#   train     kiln train of the seed MLP with compile.scope=step under default and reduce-overhead, and with
#             whole-step capture: no crash, no breaks/recompiles, the capture status
#   vit       ViT-B/16 b64 bf16 (seed001-vit): eager, default/reduce-overhead regional, capture,
#             plain loops; FLOPs per step against the matmul peak measured in the same process
#   vitbest   ViT-B/16 bf16-mixed and bf16-true, whole-model default / reduce-overhead with whole-step
#             capture beside the plain loops of both modes (autotune's winner, 2026-11-24)
#   vitcdt    vitbest's default-mode rows with inductor's coordinate-descent tuning (both precisions)
#   vitmax    ViT-B/16 max-autotune-no-cudagraphs (regional) and bf16-true rows
#   regional  cold compile time, whole-model vs regional, of a 24-block model (seed MLP) and ViT-L depth 24
# Writes $OUT/speed/<part>/results.{json,md,png} + logs, packed into $OUT/speed.tgz.
# DRY=1: the same calls on the CPU with tiny models (minutes, no GPU).
set -uo pipefail
source benchmarks/gpu_env.sh  # wheels, PYTHONPATH, $OUT
R=$OUT/speed
mkdir -p "$R"
PARTS=${PARTS:-mlp train vit}
TIMEOUT=${TIMEOUT:-240}
STEPS=${STEPS:-40}
MLP=() VIT=() TRAIN=() DEV=()
if [ "${DRY:-0}" = 1 ]; then
  MLP=(model.kwargs.hidden_size=64 model.kwargs.num_layers=4 data.batch_size=16)
  VIT=(model.kwargs.img_size=32 model.kwargs.patch_size=16 model.kwargs.embed_dim=32 model.kwargs.depth=2
       model.kwargs.num_heads=2 model.kwargs.num_classes=10 data.batch_size=4)
  TRAIN=(model.kwargs.hidden_size=64 model.kwargs.num_layers=2 data.batch_size=16 precision.policy=fp32)
  DEV=(--device cpu)
  STEPS=3
fi
t0=$(date +%s)
say() { echo "=== $* ($(date +%T), +$(( $(date +%s) - t0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$R/nvidia-smi.csv" 2>/dev/null
bench() {  # bench TAG ARGS...: one kiln bench compile call, capped
  local tag=$1; shift
  say "bench $tag"
  timeout -k 10 "$TIMEOUT" python3 -m kiln bench compile "${DEV[@]}" --steps "$STEPS" --out "$R/$tag" "$@" \
    > "$R/$tag.log" 2>&1
  echo "exit $?"; grep -E "^\[|^kiln:" "$R/$tag.log" | tail -30
}
for part in $PARTS; do
  case $part in
    mlp)
      bench mlp_fp32 --preset seed000-levels --precisions fp32 --modes default,reduce-overhead --regional on \
        --cudagraphs off,on --baseline plain --warm-start "${MLP[@]}"
      bench mlp_bf16 --preset seed000-levels --precisions bf16-mixed --modes reduce-overhead --regional on \
        --cudagraphs off,on --baseline plain "${MLP[@]}"
      ;;
    train)
      for recipe in "compile.mode=default" "compile.mode=reduce-overhead" "compile.cudagraphs=true"; do
        tag=train_step_${recipe##*=}
        say "kiln train compile.scope=step $recipe"
        timeout -k 10 "$TIMEOUT" python3 -m kiln train --config configs/seed_production.toml --run-dir "$R/$tag" \
          training.steps=200 training.log_interval=50 optim.warmup_steps=20 compile.enabled=true compile.scope=step $recipe \
          checkpoint.save_final=false metrics.console=false "${TRAIN[@]}" > "$R/$tag.log" 2>&1
        echo "exit $?"; tail -2 "$R/$tag.log"
        python3 -c "import json,sys; s=json.load(open('$R/$tag/summary.json')); print(s['status'], s.get('step_ms_median'), s['compile'])" 2>&1
      done
      ;;
    vit)
      bench vit_bf16 --preset seed001-vit --precisions bf16-mixed --losses task --modes default,reduce-overhead \
        --backends inductor --scopes model --regional on --cudagraphs off,on --baseline plain --warm-start "${VIT[@]}"
      ;;
    vitbest)
      bench vit_best --preset seed001-vit --precisions bf16-mixed,bf16-true --losses task --modes default,reduce-overhead \
        --backends inductor --scopes model --regional off --cudagraphs on --baseline plain --warmup 3 --accuracy-steps 3 \
        "${VIT[@]}"
      ;;
    vitcdt)
      bench vit_cdt --preset seed001-vit --precisions bf16-mixed,bf16-true --losses task --modes default \
        --backends inductor --scopes model --regional off --cudagraphs on --baseline plain --warmup 3 --accuracy-steps 3 \
        compile.options.coordinate_descent_tuning=true "${VIT[@]}"
      ;;
    vitmax)
      bench vit_max --preset seed001-vit --precisions bf16-mixed,bf16-true --losses task \
        --modes max-autotune-no-cudagraphs --backends inductor --scopes model --regional on --cudagraphs off,on "${VIT[@]}"
      ;;
    regional)
      bench regional_mlp --preset seed000-levels --precisions bf16-mixed --modes default --regional off,on "${MLP[@]}"
      bench regional_vitl --preset seed001-vit --precisions bf16-mixed --losses task --modes default \
        --backends inductor --scopes model --regional off,on model.kwargs.depth=24 model.kwargs.embed_dim=1024 \
        model.kwargs.num_heads=16 data.batch_size=32 "${VIT[@]}"
      ;;
  esac
done
say "done"
tar czf "$OUT/speed.tgz" -C "$R" .
