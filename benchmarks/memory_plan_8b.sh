#!/bin/bash
# Issue #42 items 1-2 on 4 GPUs: Llama-3.1-8B (random weights) at seq 8192 under FSDP2, bf16-mixed, regional
# compile, `kiln train --nproc-per-node 4` as a user runs it: does it train (it hit a CUDA OOM on every rank
# before step 1 at 78 GiB, with AC selective and with full), and how close is kiln's GPU memory plan to the
# measured peak? Run from the repo root on a 4-GPU device machine (~6-7 min, < 8 with compile):
#
#   bash benchmarks/memory_plan_8b.sh
#   PART=plan bash benchmarks/memory_plan_8b.sh   # ~4 min: the plan against the measured peaks only
#
# Runs, each STEPS steps (default 20; no checkpoints, so no 8B save outlives the call):
#   selective  data.batch_size=1 training.activation_checkpointing=selective
#   full       data.batch_size=1 training.activation_checkpointing=full
#   full-b2    data.batch_size=2 training.activation_checkpointing=full, only if kiln's plan says it fits
#              (checked on the launcher's side first: a refusal costs seconds) and the time left allows
#   refused    the documented config that cannot fit: AC none at batch 2 (its activations alone exceed
#              80 GB per rank): must exit 2, before any rank allocates the model, timed from launch.
# PART=plan runs instead, STEPS (default 8) steps each, the plan's check (allocated peak within 10 % of
# the plan's, reserved peak at most the plan's reserved figure):
#   selective         data.batch_size=1 training.activation_checkpointing=selective (bf16-mixed)
#   selective-master  the same under precision.policy=bf16-master
#   full              data.batch_size=1 training.activation_checkpointing=full
# Env: PART (all, plan), STEPS, NPROC (default 4), TOTAL_S (default 450: no run starts after TOTAL_S - 150 s).
# Writes (7 files; PART=plan 6): $OUT/r/nvidia-smi.csv, $OUT/r/{selective,full,full-b2,refused}.log (PART=plan:
# {selective,selective-master,full}.log; each run's console), $OUT/r/memory_plan_8b/results.{json,md} (per
# run: exit code, seconds, tokens/s in total and per GPU, MFU, the plan's parts, moments, allocated peak and
# reserved figure, the measured peaks allocated / reserved over the ranks, each over the plan's, the plan
# check; for the refusal its message and seconds to exit 2). Run dirs stay in /tmp.
set -uo pipefail
source benchmarks/device_env.sh
start=$(date +%s)
PART=${PART:-all}
case $PART in
  all) STEPS=${STEPS:-20} ;;
  plan) STEPS=${STEPS:-8} ;;
  *) echo "PART must be all or plan, got '$PART'" >&2; exit 2 ;;
esac
NPROC=${NPROC:-4}
TOTAL=${TOTAL_S:-450}
BASE=(model.name=llama:llama-3.1-8b distributed.strategy=fsdp data.seq_len=8192 compile.enabled=true
      compile.regional=true precision.policy=bf16-mixed "training.steps=$STEPS" training.log_interval=5
      checkpoint.interval=0 checkpoint.save_final=false metrics.tensorboard=false)

run() {  # run NAME OVERRIDES...: one kiln train job, its console in $R/NAME.log, its exit code and seconds in /tmp
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  rm -rf "/tmp/mp8b/$name"
  timeout 300 python3 -m kiln train --nproc-per-node "$NPROC" --run-dir "/tmp/mp8b/$name" "${BASE[@]}" "$@" \
    > "$R/$name.log" 2>&1
  local code=$?
  echo "$code $(python3 -c "import time; print(round(time.time() - $t0, 2))")" > "/tmp/mp8b/$name.exit"
  echo "=== $name: exit $code after $(( $(date +%s) - start )) s"
  grep -E "GPU memory plan|^  [a-z].*GiB|error:|tokens/s|step +[0-9]+/" "$R/$name.log" | grep -v '^W[0-9]' | tail -18
}

mkdir -p /tmp/mp8b
if [[ $PART == plan ]]; then
  run selective data.batch_size=1 training.activation_checkpointing=selective
  run selective-master data.batch_size=1 training.activation_checkpointing=selective precision.policy=bf16-master
  run full data.batch_size=1 training.activation_checkpointing=full
  python3 benchmarks/memory_plan_summary.py /tmp/mp8b "$R" selective selective-master full
  echo "=== done after $(( $(date +%s) - start )) s"
  exit 0
fi
run selective data.batch_size=1 training.activation_checkpointing=selective
run full data.batch_size=1 training.activation_checkpointing=full
if (( $(date +%s) - start < TOTAL - 150 )); then
  run full-b2 data.batch_size=2 training.activation_checkpointing=full
else
  echo "=== full-b2: skipped, $(( $(date +%s) - start )) s spent of TOTAL_S=$TOTAL"
fi
run refused data.batch_size=2 training.activation_checkpointing=none
python3 benchmarks/memory_plan_summary.py /tmp/mp8b "$R" selective full full-b2 refused
echo "=== done after $(( $(date +%s) - start )) s"
