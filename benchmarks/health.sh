#!/bin/bash
# Health of a run rather than its speed: what watching the GPU costs and shows, what saving a checkpoint
# costs, and how `kiln train` fails on GPUs, from the repo root of the device machine:
#   PART=monitor bash benchmarks/health.sh        # several parts comma-separated run one after the other
# Parts (time on one H100 unless said):
#   monitor     (1) kiln profile of the seed MLP (configs/seed_production.toml) eager vs reduce-overhead vs
#               whole-step CUDA-graph capture: idle gaps per step (benchmarks/profile_modes.py) and each
#               profile's summary; (2) a 3000-step `kiln train` with GPU health sampled every 0.5 s, then
#               `kiln report` of it; (3) the NVML sampler's cost on the eager step: off / 1 Hz / 20 Hz in
#               interleaved rounds (benchmarks/nvml_overhead.py) -> $OUT/monitor/ (results/h100/monitor:
#               profile_modes, train_health) (~4 min). DRY=1 runs it on the CPU with a stub NVML reader.
#   nvml        the NVML sampler's overhead again: the seed MLP eager step (launch-bound) and ViT-B/16
#               eager bf16 (GPU-bound) -> $OUT/followup/nvml_overhead{,_vit} (results/h100/monitor/nvml_overhead) (~3 min)
#   checkpoint  benchmarks/checkpoint_bench.py on the seed MLP and ViT-B/16: sync and async save time and
#               the step slowdown while an async save runs -> $OUT/r/checkpoint_{seed_production,vit_b16}
#               (results/h100/checkpoint_*) (~2 min)
#   failure     benchmarks/failure_gpu.py: a real CUDA OOM in the step; on 2+ GPUs NCCL jobs whose rank
#               is killed, raises or hangs, checked for the first failing rank named, the checkpoint kept
#               and no .tmp left -> $OUT/r/failure_gpu (~4-5 min on 2 GPUs; DRY=1: gloo ranks on the CPU)
#   nccl-hang   2 GPUs: rank 1 hangs after step 5 (KILN_FAULT=hang@5), the NCCL watchdog aborts after 20 s,
#               torchrun restarts the group and kiln resumes from the step-4 checkpoint
#               -> $OUT/r/nccl_timeout_restart (results/h200x2/nccl_timeout_restart) (~2 min)
set -uo pipefail
VALID="monitor nvml checkpoint failure nccl-hang"
for part in ${PART//,/ }; do
  [[ " $VALID " == *" $part "* ]] || { echo "health.sh: unknown PART '$part' (${VALID// /, })" >&2; exit 2; }
done
[ -n "${PART:-}" ] || { echo "health.sh: PART is required (${VALID// /, })" >&2; exit 2; }
source benchmarks/device_env.sh  # $OUT/r as $R, carried wheels, PYTHONPATH, nvidia-smi.csv, step

monitor() {
local R=$OUT/monitor CFG=configs/seed_production.toml EXTRA=() FAKE=() TRAIN_STEPS=3000 t0
mkdir -p "$R"
if [ "${DRY:-0}" = 1 ]; then
  EXTRA=(training.device=cpu model.kwargs.hidden_size=64 model.kwargs.num_layers=2 data.batch_size=16
         precision.policy=fp32 optim.warmup_steps=10)
  FAKE=(--fake-nvml --rounds 2 --sample-s 0.3)
  TRAIN_STEPS=200
fi
t0=$(date +%s)
say() { echo "=== $* ($(date +%T), +$(( $(date +%s) - t0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv > "$R/nvidia-smi.csv" 2>/dev/null

say "1. profile: eager vs reduce-overhead vs whole-step capture"
python3 benchmarks/profile_modes.py --config $CFG --steps 20 --warmup 10 --out "$R/profile_modes" "${EXTRA[@]}" \
  2>&1 | tee "$R/profile_modes.log" | grep -v '^W' | tail -12
for d in "$R"/profile_modes/*/; do
  [ -f "$d/profile_summary.json" ] && python3 -m kiln report "$d" >/dev/null 2>>"$R/report.log"
done
python3 -m kiln report "$R/profile_modes" >/dev/null 2>>"$R/report.log"

say "2. kiln train with GPU health"
python3 -m kiln train --config $CFG --run-dir "$R/train_health" training.steps=$TRAIN_STEPS training.log_interval=250 \
  metrics.gpu_health_period_s=0.5 checkpoint.save_final=false "${EXTRA[@]}" > "$R/train_health.log" 2>&1
tail -4 "$R/train_health.log"
python3 - "$R/train_health" <<'PY'
import json, sys
from pathlib import Path
records = [json.loads(l) for l in (Path(sys.argv[1]) / "metrics.jsonl").read_text().splitlines()]
keys = ["gpu_util_pct", "gpu_util_pct_min", "gpu_mem_used_bytes", "gpu_temp_c", "gpu_power_w", "gpu_power_w_max",
        "gpu_sm_clock_mhz", "gpu_sm_clock_mhz_min", "gpu_throttle_frac", "gpu_throttle_reasons", "gpu_health_samples"]
lines = ["| step | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 1)]
for r in records:
    lines.append(f"| {r['step']} | " + " | ".join(str(round(r[k], 2) if isinstance(r.get(k), float) else r.get(k, "—"))
                                                 for k in keys) + " |")
text = "# GPU health in metrics.jsonl (kiln train, seed_production)\n\n" + "\n".join(lines) + "\n"
(Path(sys.argv[1]) / "gpu_health.md").write_text(text)
print(text)
print("summary gpu_health:", json.loads((Path(sys.argv[1]) / "summary.json").read_text()).get("gpu_health"))
PY
python3 -m kiln report "$R/train_health" 2>>"$R/report.log" | tail -1

say "3. NVML sampler overhead (eager step, interleaved rounds)"
python3 benchmarks/nvml_overhead.py --config $CFG --out "$R/nvml_overhead" "${FAKE[@]}" compile.enabled=false \
  "${EXTRA[@]}" 2>&1 | tee "$R/nvml_overhead.log" | grep -v '^W' | tail -5

say "done"
echo "--- idle gaps per step"
sed -n '3,9p' "$R/profile_modes/results.md"
}

nvml() {
  local F=$OUT/followup
  mkdir -p "$F"
  timeout -k 5 130 python3 benchmarks/nvml_overhead.py --config configs/seed_production.toml --out "$F/nvml_overhead" \
    compile.enabled=false > "$F/nvml_overhead.log" 2>&1; echo "exit $?"; grep -v "^W" "$F/nvml_overhead.log" | tail -5
  timeout -k 5 100 python3 benchmarks/nvml_overhead.py --config configs/vit_b16.toml --rounds 6 --out "$F/nvml_overhead_vit" \
    compile.enabled=false > "$F/nvml_overhead_vit.log" 2>&1; echo "exit $?"; grep -v "^W" "$F/nvml_overhead_vit.log" | tail -5
  tar czf "$OUT/followup.tgz" -C "$F" .
}

nccl_hang() {
  KILN_FAULT=hang@5 KILN_FAULT_RANK=1 python3 -m kiln train --nproc-per-node 2 --max-restarts 1 \
    --run-dir "$R/nccl_timeout_restart" training.steps=12 training.log_interval=2 checkpoint.interval=4 \
    distributed.strategy=ddp distributed.timeout_s=20 metrics.console=false > "$R/nccl_timeout_restart.log" 2>&1
  echo "exit $?"; tail -20 "$R/nccl_timeout_restart.log"
}

for part in ${PART//,/ }; do
  start=$(date +%s)
  case $part in
    monitor) monitor ;;
    nvml) nvml ;;
    checkpoint)
      step checkpoint_seed_production python3 benchmarks/checkpoint_bench.py --config configs/seed_production.toml \
        --name seed_production --out "$R/checkpoint_seed_production"
      step checkpoint_vit_b16 python3 benchmarks/checkpoint_bench.py --config configs/vit_b16.toml --name vit_b16 \
        --out "$R/checkpoint_vit_b16" ;;
    failure)
      if [ "${DRY:-0}" = 1 ]; then step failure_gpu python3 benchmarks/failure_gpu.py --out "$R" --device cpu
      else step failure_gpu python3 benchmarks/failure_gpu.py --out "$R"; fi ;;
    nccl-hang) nccl_hang ;;
  esac
  tar czf "$OUT/results.tgz" -C "$R" .
done
