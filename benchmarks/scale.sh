#!/bin/bash
# Data parallelism: DDP and FSDP2 against the one-process baseline through `kiln bench scale` (each
# point a torchrun job, exactly as `kiln train --nproc-per-node N` runs it), the host cost of the
# wrappers, and the scaling model against measured and published points. From the repo root:
#   PART=one-gpu bash benchmarks/scale.sh        # several parts comma-separated run one after the other
# Every GPU part trains kiln's ViT-B/16 (configs/vit_b16.toml: bf16-mixed, torch.compile default,
# batch 64 per GPU, weak scaling). Parts:
#   multi       DDP and FSDP2 (kiln's defaults) at each rank count in NPROCS (default 1,2,4,8; counts above
#               the visible GPUs become `skipped` rows), NCCL collectives at the model's bucket and unit
#               sizes on the largest count, predictions to 1024 GPUs with their error against every
#               measured point; VARIANTS="--variant NAME=STRATEGY,KEY=VALUE ..." adds rows. ~6 min on 8
#               GPUs. Writes $OUT/scale/, $OUT/topo.txt (the committed 4 x H200 points,
#               results/h200x4/scale_vit_b16, predate `kiln bench scale`: see its README)
#   one-gpu     one H100: every DDP / FSDP2 variant that decides kiln's defaults at one rank (ddp,
#               ddp-bucket100, ddp-bf16, fsdp, fsdp-prev, fsdp-reshard, fsdp-unit1, fsdp-unit12,
#               fsdp-whole), predicted rows at 2..1024 GPUs from each measured 1-rank step, then a
#               torch.profiler look at one ddp and one fsdp step (benchmarks/step_profile.py);
#               ~6 min -> $OUT/scale_1gpu/, $OUT/profile_{ddp,fsdp}/ (results/h100/scale_1gpu).
#               EXTRA="training.device=cpu compile.enabled=false ..." STEPS=8 runs it on a CPU.
#   one-rank    one-rank DDP (kiln's default and regional compile) and FSDP2 (local-shard update and
#               the DTensor update), ~3 min -> $OUT/followup/scale_1rank
#   alternating one-rank ddp and fsdp points alternated twice each (the spread of sequential points)
#               -> $OUT/r/scale_alternating (results/h100/scale_1gpu_fsdp/scale_alternating, ~4 min)
#   host        benchmarks/fsdp_host_overhead.py --device cuda: host cost of the DDP and FSDP2 layouts per
#               step, phase and FSDP2 function -> $OUT/r/fsdp_host_overhead (results/h100/fsdp_host_overhead)
#   host-variants  the same for the no-wrapper baseline and FSDP2's one-rank copy variants
#               -> $OUT/r/host (results/h100/scale_1gpu_fsdp/host)
#   host-cpu    fsdp_host_overhead.py on the CPU (no GPU) -> benchmarks/results/cpu/fsdp_host_overhead
#   predict     the scaling model (kiln bench predict) against the committed 4 x H200 points and
#               torchtitan's published Llama 3.1 8B figures, on the CPU (seconds): rewrites
#               benchmarks/results/predictions/*
# STEPS: timed steps per point (default 60). Carry tomli_w in .whl/ for every GPU part.
set -uo pipefail
VALID="multi one-gpu one-rank alternating host host-variants host-cpu predict"
for part in ${PART//,/ }; do
  [[ " $VALID " == *" $part "* ]] || { echo "scale.sh: unknown PART '$part' (${VALID// /, })" >&2; exit 2; }
done
[ -n "${PART:-}" ] || { echo "scale.sh: PART is required (${VALID// /, })" >&2; exit 2; }
source benchmarks/device_env.sh  # $OUT/r as $R, carried wheels, PYTHONPATH, nvidia-smi.csv, step
STEPS=${STEPS:-60}

multi() {
  local NPROCS=${NPROCS:-1,2,4,8} VARIANT_ARGS
  read -r -a VARIANT_ARGS <<< "${VARIANTS:-}"
  cp "$R/nvidia-smi.csv" "$OUT/nvidia-smi.csv"
  nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
  echo "=== kiln bench scale --nprocs $NPROCS ($(date +%T))"
  python3 -m kiln bench scale --config configs/vit_b16.toml --nprocs "$NPROCS" --strategies ddp,fsdp "${VARIANT_ARGS[@]}" \
    --steps "$STEPS" --timeout 240 --out "$OUT/scale" 2>&1 | tee "$OUT/scale.log" | tail -40
}

one_gpu() {
  local EXTRA_ARGS R=$OUT/scale_1gpu s
  read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
  cp "$OUT/r/nvidia-smi.csv" "$OUT/nvidia-smi.csv"
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
  [ -f "$R/results.json" ] || { echo "no $R/results.json: see $OUT/scale_1gpu.log"; return 1; }
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
}

one_rank() {
  local F=$OUT/followup
  mkdir -p "$F"
  timeout -k 10 200 python3 -m kiln bench scale --config configs/vit_b16.toml --nprocs 1 --strategies ddp,fsdp \
    --variant ddp-regional=ddp,compile.regional=true --variant fsdp-dtensor-update=fsdp,distributed.fsdp_local_update=false \
    --steps 60 --timeout 80 --out "$F/scale_1rank" > "$F/scale_1rank.log" 2>&1; echo "exit $?"
  grep -E "^\| (none|ddp|fsdp)" "$F/scale_1rank/results.md" | cut -d'|' -f2-8 | head -8
  tar czf "$OUT/followup.tgz" -C "$F" .
}

alternating() {
  step scale timeout $(( 585 - ($(date +%s) - start) )) python3 -m kiln bench scale --config configs/vit_b16.toml \
    --nprocs 1 --strategies ddp,fsdp --variant ddp-2=ddp,distributed.ddp_bucket_cap_mb=25 \
    --variant fsdp-2=fsdp,distributed.fsdp_one_rank_fused_copy=true --steps 60 --timeout 90 --out "$R/scale_alternating"
  tar czf "$OUT/confirm.tgz" -C "$R" .
}

predict() {  # CPU only: the inputs are committed results
  local P=benchmarks/results/predictions H200=benchmarks/results/h200x4/scale_vit_b16/results.json
  rm -rf "$P/h200x4_vit_b16_baseline" "$P/h200x4_vit_b16_calibrated2" "$P/torchtitan_llama31_8b"
  # 344 GB/s: the all-reduce bus bandwidth NCCL reached on 8 x H200 (256 MB messages) in a plain
  # PyTorch measurement on the same kind of machine before kiln existed; latency and overlap cost are
  # kiln's defaults (nothing was measured on the 4 x H200 machine). The run used one FSDP unit per block.
  kiln bench predict --points "$H200" --config configs/vit_b16.toml --bus-bw 344 \
    --predict-worlds 8,16,64,256,1024 --out "$P/h200x4_vit_b16_baseline" distributed.fsdp_unit_blocks=1 || return 1
  kiln bench predict --points "$H200" --config configs/vit_b16.toml --bus-bw 344 --calibrate-at 2 \
    --predict-worlds 8,16,64,256,1024 --out "$P/h200x4_vit_b16_calibrated2" distributed.fsdp_unit_blocks=1 || return 1
  kiln bench predict --points benchmarks/published/torchtitan_llama31_8b_fsdp_compile.json --strategies fsdp \
    --calibrate-at 8 --inter-bw 45 --predict-worlds 16,32,64,128,256,512,1024 --out "$P/torchtitan_llama31_8b" \
    model.name=hf:benchmarks/published/llama-3.1-8b.config.json precision.policy=bf16-mixed data.seq_len=8192
}

for part in ${PART//,/ }; do
  start=$(date +%s)
  echo "=== part $part ($(date +%T))"
  case $part in
    multi) multi ;;
    one-gpu) one_gpu ;;
    one-rank) one_rank ;;
    alternating) alternating ;;
    host) step fsdp_host_overhead python3 benchmarks/fsdp_host_overhead.py --out "$R/fsdp_host_overhead" --device cuda \
            --config configs/vit_b16.toml --repeats 40 ;;
    host-variants) step host python3 benchmarks/fsdp_host_overhead.py --device cuda --config configs/vit_b16.toml \
            --variants none,fsdp-unit6-auto,fsdp-unit6-auto-torch-copy --repeats 40 --out "$R/host" ;;
    host-cpu) python3 benchmarks/fsdp_host_overhead.py --out benchmarks/results/cpu/fsdp_host_overhead --repeats 60 ;;
    predict) predict ;;
  esac
  echo "=== part $part done in $(( $(date +%s) - start )) s"
done
