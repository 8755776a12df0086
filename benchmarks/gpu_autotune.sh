#!/bin/bash
# GPU evidence for issue 16: `kiln autotune` on the seed MLP and on ViT-B/16, on one GPU, from the repo root:
#   bash benchmarks/gpu_autotune.sh            # both parts, about 12 minutes on one H100
#   bash benchmarks/gpu_autotune.sh mlp        # one part per device call: mlp (~5.3 min), vit (~6.8 min)
#   bash benchmarks/gpu_autotune.sh advise     # optional: kiln advise on the seed MLP b128 fp32 (~2 min)
# Parts:
#   mlp     configs/seed_production.toml (seed MLP b128), precisions fp32 and bf16-mixed allowed, budget 4.5 min.
#           Best known (benchmarks/results/h100/speed_mlp): fp32 regional default + whole-step capture
#           1.53 ms/step = 5.97x kiln eager fp32 (8.58 ms); bf16 regional reduce-overhead + capture 1.58 ms.
#   vit     configs/vit_b16.toml (ViT-B/16 b64), bf16-mixed (its own) and bf16-true allowed, budget 6 min.
#           Best known (speed_vit): bf16-mixed regional default + whole-step capture 22.51 ms/step = 1.51x eager
#           bf16 (30.82 ms), 40.3% of the measured bf16 matmul peak; bf16-true and max-autotune untried there.
#   advise  kiln advise on the seed MLP b128 fp32 eager: GPU idle gaps, the measured gain of capture, shapes.
# Why that long: the budget is the search's own clock (compiles included; kiln autotune stops in time and lists
# what it did not try); each call adds ~20-40 s of start-up, the fp64 accuracy reference and writing results.
# Each call is capped at budget + 150 s by `timeout`. Writes $OUT/r/autotune/<part>/{best.toml,results.json,
# results.md,results.png} and <part>.log, $OUT/r/nvidia-smi.csv, packed into $OUT/autotune.tgz, and prints a
# short table per part (the winner against eager fp32, eager at its precision and the config's own recipe,
# all measured in the same call).
# DRY=1: the same calls on the CPU with tiny models and 2-minute budgets (no GPU; ~6 minutes).
set -uo pipefail
source benchmarks/gpu_env.sh 2>/dev/null  # $OUT/r as $R, carried wheels, PYTHONPATH, nvidia-smi.csv
R=$R/autotune
mkdir -p "$R"
PARTS=${*:-mlp vit}
MLP_BUDGET=4.5 VIT_BUDGET=6 ADVISE=(--measure)
MLP=() VIT=() DEV=()
if [ "${DRY:-0}" = 1 ]; then
  MLP=(model.kwargs.hidden_size=32 model.kwargs.num_layers=4 model.kwargs.num_classes=8 data.batch_size=8
       optim.warmup_steps=10)
  VIT=(model.kwargs.img_size=32 model.kwargs.patch_size=16 model.kwargs.embed_dim=32 model.kwargs.depth=2
       model.kwargs.num_heads=2 model.kwargs.num_classes=10 data.batch_size=4)
  DEV=(--device cpu)
  MLP_BUDGET=2 VIT_BUDGET=2
fi
t0=$(date +%s)
say() { echo "=== $* ($(date +%T), +$(( $(date +%s) - t0 )) s)"; }
summary() {  # summary DIR: the winner, the config's own recipe and eager, from results.json
  python3 - "$1" <<'EOF'
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
EOF
}
tune() {  # tune PART BUDGET ARGS...: one kiln autotune call, capped
  local part=$1 budget=$2; shift 2
  local cap
  cap=$(python3 -c "print(int($budget * 60 + 150))")
  say "autotune $part (budget $budget min, cap $cap s)"
  rm -rf "${R:?}/$part"
  timeout -k 10 "$cap" python3 -m kiln autotune "${DEV[@]}" --budget "$budget" --out "$R/$part" "$@" > "$R/$part.log" 2>&1
  echo "exit $?"
  grep -E "^\[|^kiln:" "$R/$part.log" | tail -40
  [ -f "$R/$part/results.json" ] && summary "$R/$part"
}
for part in $PARTS; do
  case $part in
    mlp) tune mlp "$MLP_BUDGET" --config configs/seed_production.toml --precisions fp32,bf16-mixed "${MLP[@]}" ;;
    vit) tune vit "$VIT_BUDGET" --config configs/vit_b16.toml --precisions bf16-mixed,bf16-true "${VIT[@]}" ;;
    advise)
      say "advise seed MLP b128 fp32 eager"
      timeout -k 10 300 python3 -m kiln advise "${ADVISE[@]}" --json "$R/advise_mlp.json" "${DEV[@]}" \
        --config configs/seed_production.toml precision.policy=fp32 compile.enabled=false "${MLP[@]}" \
        > "$R/advise_mlp.log" 2>&1
      echo "exit $?"; tail -40 "$R/advise_mlp.log"
      ;;
    *) echo "unknown part $part (mlp, vit, advise)"; exit 2 ;;
  esac
done
say "done"
tar czf "$OUT/autotune.tgz" -C "$R" .
