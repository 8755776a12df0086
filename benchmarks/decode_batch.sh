#!/bin/bash
# Decoding at batch > 1 on one GPU, from the repo root of the device machine:
#   PART=rows,bench bash benchmarks/decode_batch.sh     # parts comma-separated, run in order
# Parts (Llama-3.2-3B shape unless MODEL names another preset, e.g. llama-3.1-8b; random weights, bf16):
#   rows    benchmarks/rows_bench.py --sweep --int4 at ROWS (default 1,4,8,16,64): every projection through
#           cuBLAS, the one-row kernels and the row kernels with every launch setting, each in its own CUDA
#           graph -> $R/rows (ROWS_S caps its seconds; it prepares no new case in its last 90). SWEEP_SKINNY
#           (row counts, e.g. 16,32,64) adds every launch setting of the dense row kernel (triton_skinny.py);
#           SWEEP_INT4=0 leaves out the int4 row kernel's; PREP=N compiles first in N processes at once.
#   bench   kiln bench llm --engines kiln-compiled at BATCHES (default 1,4,16,64) and QUANT (default
#           none,int4@triton), prompt 512, 128 new tokens, with gpt-fast's rows beside them when a checkout
#           is carried at .peers/gpt-fast (GPT_FAST=0 leaves them out) -> $R/bench (what is left of ~9 min)
#           BENCH_S caps this part's seconds (default: what is left); PREFILL=eager skips the prefill
#           compiles (shorter warm-up, eager TTFT).
#   base    kiln-compiled at batch 1 (bf16) from the source tree at .ab/base/src (an earlier commit, carried),
#           then from this tree, one process each in the same call: the A/B of a change on the batch-1 path -> $R/ab_*
#   matvec-inductor  the same bench with --decode-matvec inductor (projections by cuBLAS/inductor, the
#           path batch > 8 took before kiln.kernels.triton_rows) -> $R/bench_inductor
# Each part packs $OUT/decode_batch.tgz after each step; the call's time box is BUDGET_S (default 570 s).
set -uo pipefail
VALID="rows bench base matvec-inductor"
[ -n "${PART:-}" ] || { echo "decode_batch.sh: PART is required (${VALID// /, })" >&2; exit 2; }
for part in ${PART//,/ }; do
  [[ " $VALID " == *" $part "* ]] || { echo "decode_batch.sh: unknown PART '$part' (${VALID// /, })" >&2; exit 2; }
done
source benchmarks/device_env.sh
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
BUDGET_S=${BUDGET_S:-570}
left() { echo $(( BUDGET_S - ($(date +%s) - start) )); }
pack() { tar czf "$OUT/decode_batch.tgz" -C "$R" .; }
COMMON=(--model "${MODEL:-llama-3.2-3b}" --prompt-len 512 --new-tokens 128 --tuning decode --prefill "${PREFILL:-compiled}" --repeats 3
        --engines kiln-compiled)

for part in ${PART//,/ }; do
  case $part in
    rows)
      cap=$(left); [ "$cap" -gt "${ROWS_S:-$cap}" ] && cap=$ROWS_S
      rows_args=(--int4 --rows "${ROWS:-1,4,8,16,64}" ${SWEEP_SKINNY:+--sweep-skinny "$SWEEP_SKINNY"})
      [ "${SWEEP_INT4:-1}" = 1 ] && rows_args+=(--sweep)
      for (( i = 0; i < ${PREP:-0}; i++ )); do  # compile in PREP processes at once, into Triton's disk cache
        python3 benchmarks/rows_bench.py "${rows_args[@]}" --prepare-only --shard "$i/$PREP" --out /tmp/prep \
          > "$R/rows_prep_$i.log" 2>&1 &
      done
      wait; echo "=== rows: prepared after $(( $(date +%s) - start )) s"
      cap=$(left); [ "$cap" -gt "${ROWS_S:-$cap}" ] && cap=$ROWS_S
      step rows timeout "$cap" python3 benchmarks/rows_bench.py "${rows_args[@]}" --repeats "${REPEATS:-20}" \
        --budget-s $(( cap - 90 )) --out "$R/rows" ;;
    bench)
      peer=()
      if [ "${GPT_FAST:-1}" = 1 ] && [ -f .peers/gpt-fast/generate.py ]; then
        peer=(--gpt-fast .peers/gpt-fast --gpt-fast-quant none,int4 --gpt-fast-timeout-s "${GPT_FAST_S:-$(( $(left) / 2 ))}")
      fi
      cap=$(left); [ "$cap" -gt "${BENCH_S:-$cap}" ] && cap=$BENCH_S
      step bench timeout "$cap" python3 -m kiln bench llm "${COMMON[@]}" --batch "${BATCHES:-1,4,16,64}" \
        --quant "${QUANT:-none,int4@triton}" --deadline-s $(( cap * 2 / 3 )) --end-by-s $(( cap - 20 )) "${peer[@]}" \
        --out "$R/bench" ;;
    base)
      for side in base new; do
        src=src; [ $side = base ] && src=.ab/base/src
        step "ab_$side" env PYTHONPATH="$PWD/$src:${PYTHONPATH#$PWD/src:}" timeout 150 python3 -m kiln bench llm \
          "${COMMON[@]}" --batch 1 --quant none --out "$R/ab_$side"
      done ;;
    matvec-inductor)
      cap=$(left)
      step bench_inductor timeout "$cap" python3 -m kiln bench llm "${COMMON[@]}" --batch "${BATCHES:-1,16}" \
        --quant none --decode-matvec inductor --deadline-s $(( cap * 2 / 3 )) --out "$R/bench_inductor" ;;
  esac
  pack
done
