#!/bin/bash
# How far apart repeated runs of the same host-bound step land on one GPU machine: the seed MLP
# (b128 fp32, reduce-overhead) through benchmarks/plain_crosscheck.py (no kiln code) and through
# `kiln bench compile --baseline plain`, alternated, ROUNDS bench runs per clip value between
# ROUNDS+1 script runs, every run its own process on the same CPU cores (taskset -c 2-7), as
# evidence.sh runs them. One device call (~7 min on an H100 with ROUNDS=3):
#   bash benchmarks/mlp_noise.sh
# Writes $OUT/mlp_noise.tgz holding script/crosscheck_mlp.json (every script run, in order: clip 0
# then clip 1), bench_clip<C>_<i>/results.{json,md}, each step's log and summary.{json,md}
# (benchmarks/evidence_summary.py --parts repeats: the medians over runs and their gap), in one
# file, so the device tool brings all of it back.
set -uo pipefail
source benchmarks/device_env.sh
ROUNDS=${ROUNDS:-3}
pin=(); command -v taskset >/dev/null && [ "$(nproc)" -ge 8 ] && pin=(taskset -c 2-7)
script() {  # script CLIP
  step "script_clip$1" timeout 40 "${pin[@]}" python3 benchmarks/plain_crosscheck.py --model mlp \
    --mode reduce-overhead --clip "$1" --steps 200 --append --out "$R/script"
}
for clip in 0 1; do
  script $clip
  for i in $(seq 1 "$ROUNDS"); do
    step "bench_clip${clip}_$i" timeout 70 "${pin[@]}" python3 -m kiln bench compile --preset seed000-levels \
      --precisions fp32 --modes reduce-overhead --cudagraphs off --baseline plain --steps 200 --accuracy-steps 0 \
      --warm-cache --out "$R/bench_clip${clip}_$i" training.grad_clip=$clip
    script $clip
  done
done
python3 benchmarks/evidence_summary.py "$R" --parts repeats --out "$R"
echo "=== done in $(( $(date +%s) - start )) s"
tar czf "$OUT/mlp_noise.tgz" -C "$R" . && rm -rf "$R"
