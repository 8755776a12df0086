#!/bin/bash
# Compile recipes: kiln's compiled steps against eager and the user's own plain torch.compile loop,
# and `kiln autotune` / `kiln advise`, on one GPU, from the repo root of the device machine:
#   PART=mlp,vit bash benchmarks/compile.sh          # several parts in one call, in order
# Parts (time on one H100; each kiln call is capped by `timeout`):
#   preset      `kiln bench compile --preset $PRESET $ARGS` as is (TAG names the folder, default the preset):
#               PRESET=seed001-vit ARGS="--steps 30" -> results/h100/bench_compile_seed001_vit;
#               PRESET=seed000-levels ARGS="--steps 50 --modes default,reduce-overhead,max-autotune-no-cudagraphs"
#               -> bench_compile_seed000_levels (~3-5 min). Writes $OUT/r/$TAG/, packs $OUT/results.tgz.
#   mlp         seed MLP b128 fp32 + bf16 (seed000-levels): eager, whole-step capture, regional,
#               reduce-overhead, plain hand loops, cold and warm compile -> results/h100/speed_mlp (~4 min)
#   step-scope  kiln train of the seed MLP with compile.scope=step under default / reduce-overhead / whole-step
#               capture: no crash, no breaks or recompiles, the capture status -> results/h100/speed_step_scope
#   vit         ViT-B/16 b64 bf16 (seed001-vit): eager, regional default / reduce-overhead, capture, plain loops,
#               FLOPs against the matmul peak measured in the same process -> results/h100/speed_vit (~4 min)
#   vit-best    ViT-B/16 bf16-mixed and bf16-true, whole-model default / reduce-overhead with whole-step capture
#               beside the plain loops of both modes -> results/h100/speed_vit_best (~4 min)
#   vit-cdt     vit-best's default-mode rows with inductor's coordinate-descent tuning (TIMEOUT=560 used: ~9 min)
#   vit-max     ViT-B/16 max-autotune-no-cudagraphs (regional) and bf16-true rows
#   regional    cold compile time, whole-model vs regional, of the 24-block seed MLP and a ViT-L depth-24
#               -> results/h100/regional_compile (~4 min)
#   vit-recipes ViT-B/16 b64 whole-step capture with regional reduce-overhead / max-autotune-no-cudagraphs,
#               bf16-mixed and bf16-true, and cuDNN attention -> results/h100/speed_vit_recipes (~4.5 min)
#   autotune-mlp  kiln autotune, configs/seed_production.toml, fp32 and bf16-mixed allowed, budget 4.5 min
#               -> results/h100/autotune/mlp (~5.3 min)
#   autotune-vit  kiln autotune, configs/vit_b16.toml, bf16-mixed and bf16-true allowed, budget 6 min
#               -> results/h100/autotune/vit (~6.8 min)
#   advise      kiln advise on the seed MLP b128 fp32 eager (GPU idle gaps, measured gain of capture) (~2 min)
# The mlp .. regional parts write $OUT/speed/<tag>/ (+ logs, packed into $OUT/speed.tgz; TIMEOUT caps each
# call, default 240 s; STEPS default 40); vit-recipes writes $OUT/followup/ ($OUT/followup.tgz); the
# autotune parts $OUT/r/autotune/<part>/ ($OUT/autotune.tgz; each call capped at budget + 150 s).
# DRY=1: the mlp .. regional and autotune parts on the CPU with tiny models (minutes, no GPU).
# The plain loop written without kiln (benchmarks/plain_crosscheck.py) is benchmarks/evidence.sh's.
set -uo pipefail
VALID="preset mlp step-scope vit vit-best vit-cdt vit-max regional vit-recipes autotune-mlp autotune-vit advise"
for part in ${PART//,/ }; do
  [[ " $VALID " == *" $part "* ]] || { echo "compile.sh: unknown PART '$part' (${VALID// /, })" >&2; exit 2; }
done
[ -n "${PART:-}" ] || { echo "compile.sh: PART is required (${VALID// /, })" >&2; exit 2; }
source benchmarks/device_env.sh 2>/dev/null  # $OUT/r as $R, carried wheels, PYTHONPATH, nvidia-smi.csv, step
t0=$(date +%s)
say() { echo "=== $* ($(date +%T), +$(( $(date +%s) - t0 )) s)"; }
TIMEOUT=${TIMEOUT:-240}
STEPS=${STEPS:-40}
MLP=() VIT=() TRAIN=() DEV=() AMLP=() AVIT=()
MLP_BUDGET=4.5 VIT_BUDGET=6
if [ "${DRY:-0}" = 1 ]; then
  MLP=(model.kwargs.hidden_size=64 model.kwargs.num_layers=4 data.batch_size=16)
  VIT=(model.kwargs.img_size=32 model.kwargs.patch_size=16 model.kwargs.embed_dim=32 model.kwargs.depth=2
       model.kwargs.num_heads=2 model.kwargs.num_classes=10 data.batch_size=4)
  TRAIN=(model.kwargs.hidden_size=64 model.kwargs.num_layers=2 data.batch_size=16 precision.policy=fp32)
  AMLP=(model.kwargs.hidden_size=32 model.kwargs.num_layers=4 model.kwargs.num_classes=8 data.batch_size=8
        optim.warmup_steps=10)
  AVIT=("${VIT[@]}")
  DEV=(--device cpu)
  STEPS=3 MLP_BUDGET=2 VIT_BUDGET=2
fi

preset() {  # `kiln bench compile --preset $PRESET $ARGS`
  local p=${PRESET:?PART=preset needs PRESET=<kiln bench compile preset>} args
  read -r -a args <<< "${ARGS:-}"
  local tag=${TAG:-$p}
  echo "=== kiln bench compile --preset $p ${args[*]} ($(date +%T))"
  python3 -m kiln bench compile --preset "$p" --out "$R/$tag" "${args[@]}" 2>&1 | tee "$R/$tag.log" | grep -v '^W'
  tar czf "$OUT/results.tgz" -C "$R" .
}

speed() {  # speed PART: the kiln bench compile / kiln train calls of one speed part, into $OUT/speed
  local R=$OUT/speed tag recipe
  mkdir -p "$R"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$R/nvidia-smi.csv" 2>/dev/null
  bench() {  # bench TAG ARGS...: one kiln bench compile call, capped
    local tag=$1; shift
    say "bench $tag"
    timeout -k 10 "$TIMEOUT" python3 -m kiln bench compile "${DEV[@]}" --steps "$STEPS" --out "$R/$tag" "$@" \
      > "$R/$tag.log" 2>&1
    echo "exit $?"; grep -E "^\[|^kiln:" "$R/$tag.log" | tail -30
  }
  case $1 in
    mlp)
      bench mlp_fp32 --preset seed000-levels --precisions fp32 --modes default,reduce-overhead --regional on \
        --cudagraphs off,on --baseline plain --warm-start "${MLP[@]}"
      bench mlp_bf16 --preset seed000-levels --precisions bf16-mixed --modes reduce-overhead --regional on \
        --cudagraphs off,on --baseline plain "${MLP[@]}"
      ;;
    step-scope)
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
    vit-best)
      bench vit_best --preset seed001-vit --precisions bf16-mixed,bf16-true --losses task --modes default,reduce-overhead \
        --backends inductor --scopes model --regional off --cudagraphs on --baseline plain --warmup 3 --accuracy-steps 3 \
        "${VIT[@]}"
      ;;
    vit-cdt)
      bench vit_cdt --preset seed001-vit --precisions bf16-mixed,bf16-true --losses task --modes default \
        --backends inductor --scopes model --regional off --cudagraphs on --baseline plain --warmup 3 --accuracy-steps 3 \
        compile.options.coordinate_descent_tuning=true "${VIT[@]}"
      ;;
    vit-max)
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
  tar czf "$OUT/speed.tgz" -C "$R" .
}

vit_recipes() {  # ViT-B/16 whole-step capture recipes, into $OUT/followup
  local F=$OUT/followup
  mkdir -p "$F"
  vit() {  # vit TAG CAP ARGS...: one capped kiln bench compile call on the ViT-B/16 preset
    local tag=$1 cap=$2; shift 2
    timeout -k 10 "$cap" python3 -m kiln bench compile --preset seed001-vit --losses task --backends inductor \
      --scopes model --regional on --cudagraphs on --steps 30 --out "$F/$tag" "$@" > "$F/$tag.log" 2>&1
    echo "$tag exit $?"; grep -E "^\[|^kiln:" "$F/$tag.log" | tail -6
  }
  say "ViT-B/16 recipes"
  vit vit_mixed 150 --precisions bf16-mixed --modes reduce-overhead,max-autotune-no-cudagraphs
  vit vit_true 60 --precisions bf16-true --modes reduce-overhead
  vit vit_cudnn 60 --precisions bf16-mixed --modes reduce-overhead model.kwargs.attn_backend=cudnn
  tar czf "$OUT/followup.tgz" -C "$F" .
}

autotune_summary() {  # autotune_summary DIR: the winner, the config's own recipe and eager, from results.json
  python3 - "$1" <<'PY'
import json, sys
payload = json.load(open(f"{sys.argv[1]}/results.json"))
rows, tune = payload["results"], payload["config"]["autotune"]
fmt = lambda v, f: "-" if v is None else format(v, f)
print(f"{'role':8} {'stage':17} {'candidate':46} {'status':9} {'ms':>8} {'vs fp32':>8} {'vs eager':>8} {'vs config':>9} {'compile s':>9}")
for r in rows:
    if r.get("role") or r.get("stage") in ("baseline", "confirm"):
        print(f"{r.get('role') or '':8} {r.get('stage') or '':17} {r['candidate'][:46]:46} {r['status']:9} "
              f"{fmt(r.get('step_ms'), '.3f'):>8} {fmt(r.get('speedup_vs_eager_fp32'), '.2f'):>8} "
              f"{fmt(r.get('speedup'), '.2f'):>8} {fmt(r.get('speedup_vs_default'), '.2f'):>9} {fmt(r.get('compile_s'), '.1f'):>9}")
measured = sum(1 for r in rows if not str(r.get("reason") or "").startswith("not tried"))
print(f"{measured} rows measured, {len(tune['not_tried'])} not tried, {tune['elapsed_s'] / 60:.1f} min; "
      f"decided on {tune['decided_on']} rows; changes: {tune['changes']}")
PY
}

autotune() {  # autotune PART BUDGET ARGS...: one kiln autotune call, capped, into $OUT/r/autotune/PART
  local part=$1 budget=$2 R=$R/autotune cap; shift 2
  mkdir -p "$R"
  cap=$(python3 -c "print(int($budget * 60 + 150))")
  say "autotune $part (budget $budget min, cap $cap s)"
  rm -rf "${R:?}/$part"
  timeout -k 10 "$cap" python3 -m kiln autotune "${DEV[@]}" --budget "$budget" --out "$R/$part" "$@" > "$R/$part.log" 2>&1
  echo "exit $?"
  grep -E "^\[|^kiln:" "$R/$part.log" | tail -40
  [ -f "$R/$part/results.json" ] && autotune_summary "$R/$part"
  tar czf "$OUT/autotune.tgz" -C "$R" .
}

advise() {  # kiln advise on the seed MLP b128 fp32 eager
  local R=$R/autotune
  mkdir -p "$R"
  say "advise seed MLP b128 fp32 eager"
  timeout -k 10 300 python3 -m kiln advise --measure --json "$R/advise_mlp.json" "${DEV[@]}" \
    --config configs/seed_production.toml precision.policy=fp32 compile.enabled=false "${AMLP[@]}" \
    > "$R/advise_mlp.log" 2>&1
  echo "exit $?"; tail -40 "$R/advise_mlp.log"
  tar czf "$OUT/autotune.tgz" -C "$R" .
}

for part in ${PART//,/ }; do
  case $part in
    preset) preset ;;
    mlp|step-scope|vit|vit-best|vit-cdt|vit-max|regional) speed "$part" ;;
    vit-recipes) vit_recipes ;;
    autotune-mlp) autotune mlp "$MLP_BUDGET" --config configs/seed_production.toml --precisions fp32,bf16-mixed "${AMLP[@]}" ;;
    autotune-vit) autotune vit "$VIT_BUDGET" --config configs/vit_b16.toml --precisions bf16-mixed,bf16-true "${AVIT[@]}" ;;
    advise) advise ;;
  esac
done
say "done"
