#!/bin/bash
# Follow-up GPU evidence in one call (one H100, ~9.5 min for all three), each part capped:
#   bash benchmarks/gpu_followup.sh [PART...]   (parts 1 2 3 by default)
#   1. NVML sampler overhead (benchmarks/nvml_overhead.py): the seed MLP eager step (launch-bound:
#      where a sampler thread taking the GIL would show) and ViT-B/16 eager bf16 (GPU-bound, less
#      noisy), ~3 min
#   2. one-rank DDP and FSDP2 on ViT-B/16 bf16 compiled (kiln bench scale --nprocs 1), ~3 min:
#      DDP as kiln runs it now (torch's default compile of the wrapped model) and with regional
#      compile (what the committed 44.1 ms row ran: the measured recipe without its capture);
#      FSDP2 as kiln runs it (update on the local shards) and with the update on the DTensor path
#   3. ViT-B/16 b64: whole-step capture with regional reduce-overhead / max-autotune-no-cudagraphs,
#      bf16-mixed and bf16-true, and the cuDNN attention kernel (kiln bench compile), ~4.5 min
# Writes $OUT/followup/<part>/... and packs $OUT/followup.tgz after each part.
set -uo pipefail
source benchmarks/gpu_env.sh
F=$OUT/followup
mkdir -p "$F"
t0=$(date +%s)
say() { echo "=== $* (+$(( $(date +%s) - t0 )) s)"; }
part1() {
say "1. NVML sampler overhead"
timeout -k 5 130 python3 benchmarks/nvml_overhead.py --config configs/seed_production.toml --out "$F/nvml_overhead" \
  compile.enabled=false > "$F/nvml_overhead.log" 2>&1; echo "exit $?"; grep -v "^W" "$F/nvml_overhead.log" | tail -5
timeout -k 5 100 python3 benchmarks/nvml_overhead.py --config configs/vit_b16.toml --rounds 6 --out "$F/nvml_overhead_vit" \
  compile.enabled=false > "$F/nvml_overhead_vit.log" 2>&1; echo "exit $?"; grep -v "^W" "$F/nvml_overhead_vit.log" | tail -5
}
part2() {
say "2. one-rank DDP / FSDP2"
timeout -k 10 200 python3 -m kiln bench scale --config configs/vit_b16.toml --nprocs 1 --strategies ddp,fsdp \
  --variant ddp-regional=ddp,compile.regional=true --variant fsdp-dtensor-update=fsdp,distributed.fsdp_local_update=false \
  --steps 60 --timeout 80 --out "$F/scale_1rank" > "$F/scale_1rank.log" 2>&1; echo "exit $?"
grep -E "^\| (none|ddp|fsdp)" "$F/scale_1rank/results.md" | cut -d'|' -f2-8 | head -8
}
part3() {
say "3. ViT-B/16 recipes"
vit() {  # vit TAG CAP ARGS...: one capped kiln bench compile call on the ViT-B/16 preset
  local tag=$1 cap=$2; shift 2
  timeout -k 10 "$cap" python3 -m kiln bench compile --preset seed001-vit --losses task --backends inductor \
    --scopes model --regional on --cudagraphs on --steps 30 --out "$F/$tag" "$@" > "$F/$tag.log" 2>&1
  echo "$tag exit $?"; grep -E "^\[|^kiln:" "$F/$tag.log" | tail -6
}
vit vit_mixed 150 --precisions bf16-mixed --modes reduce-overhead,max-autotune-no-cudagraphs
vit vit_true 60 --precisions bf16-true --modes reduce-overhead
vit vit_cudnn 60 --precisions bf16-mixed --modes reduce-overhead model.kwargs.attn_backend=cudnn
}
for part in ${*:-1 2 3}; do
  case $part in 1|2|3) "part$part" ;; *) echo "unknown part $part (1, 2, 3)"; exit 2 ;; esac
  tar czf "$OUT/followup.tgz" -C "$F" .  # after each part: what a cut-off call finished still comes back
done
say "done"
