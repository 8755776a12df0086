#!/bin/bash
# GPU evidence for issue 13 (run on the device machine from the repo root). Expected ~4 min on one
# H100: profiles ~1.5 min (eager ~20 s; reduce-overhead ~40 s with its compile; whole-step capture
# ~60 s or skipped; each capped at 120 s), train ~45 s (19 s compile + 3000 steps), NVML overhead
# ~65 s (6 rounds x 3 sides x ~3 s), reports ~15 s. Run it as `bash benchmarks/gpu_monitor.sh`.
#  1. kiln profile of the seed MLP (configs/seed_production.toml: batch 128, bf16) eager vs
#     compile.mode=reduce-overhead vs whole-step CUDA-graph capture (compile.scope=step
#     compile.cudagraphs=true; a `skipped` row with the reason where this kiln lacks the key):
#     idle-gap comparison table (benchmarks/profile_modes.py) and each profile's summary/trace;
#  2. a short `kiln train` of the same config with GPU health on, then `kiln report` of it;
#  3. the NVML sampler's overhead on step time: off / 1 Hz / 20 Hz in interleaved rounds in one
#     process (benchmarks/nvml_overhead.py, eager: the launch-bound, most CPU-sensitive case).
# Everything lands in $OUT/monitor/ (results.json + results.md per part, reports, logs).
# DRY=1 runs the same steps on the CPU with a tiny model and a stub NVML reader (minutes, no GPU).
set -uo pipefail
source benchmarks/gpu_env.sh  # wheels, PYTHONPATH, $OUT
R=$OUT/monitor
mkdir -p "$R"
CFG=configs/seed_production.toml
EXTRA=()
FAKE=()
TRAIN_STEPS=3000
if [ "${DRY:-0}" = 1 ]; then
  EXTRA=(training.device=cpu model.kwargs.hidden_size=64 model.kwargs.num_layers=2 data.batch_size=16
         precision.policy=fp32 optim.warmup_steps=10)
  FAKE=(--fake-nvml --rounds 2 --sample-s 0.3)
  TRAIN_STEPS=200
fi
t0=$(date +%s)
step() { echo "=== $* ($(date +%T), +$(( $(date +%s) - t0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv > "$R/nvidia-smi.csv" 2>/dev/null

step "1. profile: eager vs reduce-overhead vs whole-step capture"
python3 benchmarks/profile_modes.py --config $CFG --steps 20 --warmup 10 --out "$R/profile_modes" "${EXTRA[@]}" \
  2>&1 | tee "$R/profile_modes.log" | grep -v '^W' | tail -12
for d in "$R"/profile_modes/*/; do
  [ -f "$d/profile_summary.json" ] && python3 -m kiln report "$d" >/dev/null 2>>"$R/report.log"
done
python3 -m kiln report "$R/profile_modes" >/dev/null 2>>"$R/report.log"

step "2. kiln train with GPU health"
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

step "3. NVML sampler overhead (eager step, interleaved rounds)"
python3 benchmarks/nvml_overhead.py --config $CFG --out "$R/nvml_overhead" "${FAKE[@]}" compile.enabled=false \
  "${EXTRA[@]}" 2>&1 | tee "$R/nvml_overhead.log" | grep -v '^W' | tail -5

step "done"
echo "--- idle gaps per step"
sed -n '3,9p' "$R/profile_modes/results.md"
