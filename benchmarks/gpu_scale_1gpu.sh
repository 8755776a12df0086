#!/bin/bash
# ONE GPU (H100): FSDP2 vs DDP at one rank for kiln's ViT-B/16, bf16-mixed, torch.compile default,
# batch 64 (configs/vit_b16.toml), through `kiln bench scale` (each point a torchrun job, exactly as
# `kiln train --nproc-per-node 1` runs it), with the variants that decide kiln's defaults:
#   none           the one-process baseline (no wrapper)
#   ddp            kiln default: whole-model compile after wrapping, graph split at 25 MiB buckets
#   ddp-bucket100  100 MiB buckets (torchtitan's choice): 4 graph pieces instead of 13
#   ddp-bf16       bf16 gradient all-reduce hook (what the hook costs by itself at one rank)
#   fsdp           kiln default: blocks compiled one by one, 2 units of 6 blocks (>= 64 MiB gathered
#                  each), nothing resharded after forward (reshard `auto`: the model gathers < 1 GiB)
#   fsdp-prev      the previous default: 4 units of 3 blocks (>= 32 MiB), all but the last resharded
#   fsdp-reshard   today's units, all but the last resharded after forward (ZeRO-3: backward all-gathers)
#   fsdp-unit1     one block per unit (the committed 4-GPU run's layout, bar its resharded last block)
#   fsdp-unit12    all 12 blocks in one unit (fewest hooks, no overlap at scale)
#   fsdp-whole     the whole model compiled around FSDP2's hooks instead of per block
# --nprocs 1,2,4,8: the 2/4/8-rank points are `skipped` (one GPU), and so is the collective step,
# but every variant gets predicted rows at 2..1024 GPUs from its measured 1-rank step (bandwidth,
# latency and overlap cost given: nothing to measure them with on one GPU).
# Then a torch.profiler look at one ddp and one fsdp step (benchmarks/step_profile.py): device-busy
# time vs wall time per step says whether FSDP2's step waits for the host, and the top host ops why.
# Expected: ~6 min. 10 launches of ~20-40 s (torchrun + imports ~8 s, whole-model compile ~20 s,
# per-block ~5 s, cached graphs faster, 60 steps ~2 s), then 2 profiles of ~30 s.
# Writes $OUT/scale_1gpu/{results.json,results.md,results.png,points/*}, $OUT/profile_{ddp,fsdp}/,
# $OUT/nvidia-smi.csv.
# CPU dry run of this exact script (tiny ViT, a minute or two):
#   OUT=/tmp/dry STEPS=8 EXTRA="training.device=cpu compile.enabled=false model.kwargs.depth=4 \
#     model.kwargs.embed_dim=32 model.kwargs.num_heads=2 model.kwargs.img_size=32 model.kwargs.patch_size=8 \
#     data.batch_size=4 optim.warmup_steps=0" bash benchmarks/gpu_scale_1gpu.sh
set -uo pipefail
OUT=${OUT:-/tmp/kiln-out}
STEPS=${STEPS:-60}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
source benchmarks/gpu_env.sh  # wheels, PYTHONPATH, $OUT
cp "$OUT/r/nvidia-smi.csv" "$OUT/nvidia-smi.csv"
R=$OUT/scale_1gpu
echo "=== kiln bench scale, one GPU ($(date +%T))"
timeout 380 python3 -m kiln bench scale --config configs/vit_b16.toml --nprocs 1,2,4,8 --strategies ddp,fsdp \
  --variant ddp-bucket100=ddp,distributed.ddp_bucket_cap_mb=100 \
  --variant ddp-bf16=ddp,distributed.ddp_comm_hook=bf16 \
  --variant fsdp-prev=fsdp,distributed.fsdp_unit_blocks=3,distributed.fsdp_reshard_after_forward=true \
  --variant fsdp-reshard=fsdp,distributed.fsdp_reshard_after_forward=true \
  --variant fsdp-unit1=fsdp,distributed.fsdp_unit_blocks=1 \
  --variant fsdp-unit12=fsdp,distributed.fsdp_unit_blocks=12 \
  --variant fsdp-whole=fsdp,distributed.compile_strategy=whole \
  --steps "$STEPS" --timeout 90 --predict-worlds 16,64,256,1024 --out "$R" "${EXTRA_ARGS[@]}" 2>&1 | tee "$OUT/scale_1gpu.log" | tail -60
echo "=== step profiles ($(date +%T))"
for s in ddp fsdp; do
  timeout 60 python3 benchmarks/step_profile.py --config configs/vit_b16.toml --name "$s" --out "$OUT/profile_$s" \
    distributed.strategy=$s "${EXTRA_ARGS[@]}" 2>&1 | grep -v "^USDT" | tail -18
done
echo "=== done ($(date +%T))"
[ -f "$R/results.json" ] || { echo "no $R/results.json: see $OUT/scale_1gpu.log"; exit 1; }
python3 - "$R/results.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
pts = {r["variant"]: r for r in rows if r.get("kind") == "point" and r.get("world") == 1}
ddp = pts.get("ddp", {}).get("throughput_per_device")
print(f"{'variant':14s} {'status':8s} {'step ms':>8s} {'img/s':>8s} {'vs none':>8s} {'vs ddp':>8s}")
for name, r in pts.items():
    tpd = r.get("throughput_per_device")
    vs_ddp = f"{tpd / ddp:8.3f}" if tpd and ddp else "       -"
    eff = r.get("efficiency")
    print(f"{name:14s} {r['status']:8s} {r.get('step_ms') or 0:8.2f} {tpd or 0:8.0f} {eff or 0:8.3f} {vs_ddp}")
PY
