#!/bin/bash
# LLM training on one GPU: kiln's recipes vs the plain transformers loop vs torchtitan 0.2.2, each
# `kiln bench train-llm` call one process (torchtitan in its own), every row from the same initial
# weights on the same tokens. Run from the repo root on the device machine:
#
#   PART=1b bash benchmarks/train_llm.sh      # ~5 min: Llama-3.2-1B shape (untied: torchtitan cannot
#                                             # tie), seq 2048, batch 4, bf16, 50 steps: plain, kiln
#                                             # recipes, torchtitan; losses compared after 50 steps
#   PART=long bash benchmarks/train_llm.sh    # ~4 min: the 1B shape at seq 8192, batch 1, 20 steps:
#                                             # kiln recipes (tokens/s, memory) and the plain loop
#   PART=float8 bash benchmarks/train_llm.sh  # ~5 min: Llama-3.2-3B shape, seq 2048, batch 6
#                                             # (FLOAT8_BATCH), 100 steps: kiln bf16 vs float8
#                                             # tensorwise vs rowwise (torchao)
#   PART=features bash benchmarks/train_llm.sh  # benchmarks/llm_train_features.py on the 1B shape: the
#                                             # cross-entropy kernels and activation checkpointing modes
#                                             # each on their own (time, memory, differences)
#   PART=float8,1b KILN_ROWS_1B=kiln-regional,kiln-capture NO_TORCHTITAN=1 PROFILE=kiln-regional \
#     bash benchmarks/train_llm.sh            # several parts in one call, sharing TOTAL_S (default 530 s)
#
# Env: KILN_ROWS_<PART> (1B, LONG, FLOAT8) picks the kiln recipes of a part; BATCH_1B the 1b part's
# batch size (default 4: results/h100/llm_train/1b; 8 in 1b_batch8); NO_TORCHTITAN=1 drops
# the peer row; PROFILE=<recipe> runs `kiln profile` on that recipe of the 1b part after it, if the
# time left allows (its summary lands in $R/profile/). FLOAT8_AC: activation checkpointing of the
# float8 rows (default selective: the 3B training state alone takes ~51 GB; `full` if selective
# runs out of memory on an 80 GB GPU); FLOAT8_BATCH: its batch size (default 6:
# results/h100/llm_train/float8_3b; 4 in float8_1b).
# Needs .whl/ carried (tomli_w, torchao, torchtitan 0.2.2 and its dependencies, liger-kernel). The
# corpus, tokenizer and initial weights are generated at run time under /tmp (not carried). Every
# row fails on its own (status error/oom with the reason) and the results are written after each
# row. Writes $OUT/r/<part>/results.{json,md}, $OUT/r/train_llm_<part>.log (and torchtitan's log and
# job for part 1b).
set -uo pipefail
source benchmarks/device_env.sh
start=$(date +%s)
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
python3 -c "import torchtitan, importlib.metadata as m; print('torchtitan', m.version('torchtitan'))" 2>&1 | tail -1
python3 -c "import liger_kernel, importlib.metadata as m; print('liger-kernel', m.version('liger-kernel'))" 2>&1 | tail -1

ac8=${FLOAT8_AC:-selective}
# Kiln recipes: NAME: overrides on the bench's base config (kiln's own llama decoder, bf16-mixed).
declare -A RECIPE=(
  [kiln]="compile.enabled=true"
  [kiln-regional]="compile.enabled=true compile.regional=true"
  [kiln-capture]="compile.enabled=true compile.regional=true compile.cudagraphs=true"
  [kiln-loss]="compile.enabled=true compile.scope=model+loss training.ce_kernel=plain"
  [kiln-mat]="compile.enabled=true compile.regional=true compile.mode=max-autotune-no-cudagraphs"
  [kiln-master]="compile.enabled=true compile.scope=model+loss training.ce_kernel=plain precision.policy=bf16-master"
  [kiln-master-tce]="compile.enabled=true compile.scope=model+loss training.ce_kernel=triton precision.policy=bf16-master"
  [kiln-master-pswiglu]="compile.enabled=true compile.scope=model+loss training.ce_kernel=plain precision.policy=bf16-master training.swiglu_kernel=plain"
  [kiln-master-regional]="compile.enabled=true compile.regional=true precision.policy=bf16-master"
  [kiln-master-chunked]="compile.enabled=true compile.scope=model+loss training.ce_kernel=chunked precision.policy=bf16-master"
  [kiln-master-cdt]="compile.enabled=true compile.scope=model+loss training.ce_kernel=plain precision.policy=bf16-master compile.options.coordinate_descent_tuning=true"
  [kiln-liger]="compile.enabled=true compile.regional=true training.ce_kernel=liger"
  [kiln-fsdp-bf16]="compile.enabled=true distributed.strategy=fsdp distributed.fsdp_param_dtype=bf16"
  [kiln-ac]="compile.enabled=true compile.regional=true training.activation_checkpointing=selective"
  [kiln-bf16]="compile.enabled=true compile.regional=true training.activation_checkpointing=$ac8"
  [kiln-fp8-tensorwise]="compile.enabled=true compile.regional=true training.activation_checkpointing=$ac8 precision.float8=tensorwise"
  [kiln-fp8-rowwise]="compile.enabled=true compile.regional=true training.activation_checkpointing=$ac8 precision.float8=rowwise"
)
declare -A ROWS=([1b]=${KILN_ROWS_1B:-kiln-regional,kiln,kiln-liger,kiln-fsdp-bf16}
                 [long]=${KILN_ROWS_LONG:-kiln-regional,kiln-ac}
                 [float8]=${KILN_ROWS_FLOAT8:-kiln-bf16,kiln-fp8-tensorwise,kiln-fp8-rowwise})
# Seconds a part may take when it shares the call with others, and how long its last row may run
# (the bench starts no row later than share - tail).
declare -A SHARE=([1b]=210 [long]=200 [float8]=300 [features]=250)
declare -A TAIL=([1b]=60 [long]=70 [float8]=110 [features]=0)
TOTAL=${TOTAL_S:-530}
parts=${PART:-1b}
parts=${parts//,/ }
nparts=$(wc -w <<< "$parts")

run_part() {  # run_part PART SECONDS
  local part=$1 share=$2 data=/tmp/kiln-train-llm-$1 args=() recipes=() rows first rest name
  rm -rf "$data"
  if [ "$part" = features ]; then
    step train_llm_features timeout "$share" python3 benchmarks/llm_train_features.py --out "$R/features" --compile
    return
  fi
  for name in ${ROWS[$part]//,/ }; do recipes+=(--recipe "$name: ${RECIPE[$name]}"); done
  local deadline=$(( share - TAIL[$part] ))
  case $part in
    # torchtitan after the first kiln recipe: a slow compile late in the call must not cost the peer row.
    1b) first=${ROWS[1b]%%,*}; rest=${ROWS[1b]#"$first"}
        rows="plain,$first,torchtitan$rest"; [ -n "${NO_TORCHTITAN:-}" ] && rows="plain,${ROWS[1b]}"
        # --untie: the shape torchtitan trains, with or without its row, so calls compare.
        args=(--model llama-3.2-1b --seq-len 2048 --batch-size "${BATCH_1B:-4}" --steps 50 --warmup 10 --rows "$rows"
              --torchtitan-timeout-s 240 --untie) ;;
    long) args=(--model llama-3.2-1b --seq-len 8192 --batch-size 1 --steps 20 --warmup 5
                --rows "${ROWS[long]},plain") ;;
    float8) first=${ROWS[float8]%%,*}
            args=(--model llama-3.2-3b --seq-len 2048 --batch-size "${FLOAT8_BATCH:-6}" --steps 100 --warmup 10
                  --rows "${ROWS[float8]}" --baseline "$first") ;;
    *) echo "PART must be 1b, long, float8 or features (comma-separated), got '$part'" >&2; return 2 ;;
  esac
  step "train_llm_$part" timeout "$share" python3 -m kiln bench train-llm "${args[@]}" "${recipes[@]}" \
    --skip-invalid-recipes --deadline-s "$deadline" --data-dir "$data" --out "$R/$part"
  if [ -f "$data/torchtitan/torchtitan.log" ]; then
    cp "$data/torchtitan/torchtitan.log" "$R/$part/torchtitan.log"
    cp "$data/torchtitan/job.toml" "$R/$part/torchtitan_job.toml"
  fi
}

profile_recipe() {  # kiln profile of one recipe of the 1b part, on its data and initial weights
  local name=$1 data=/tmp/kiln-train-llm-1b out=/tmp/kiln-train-llm-profile
  rm -rf "$out"
  step "profile_$name" timeout "$2" python3 -m kiln profile --steps 8 --warmup 4 --memory-steps 0 --out "$out" \
    "model.name=llama:$data/init" data.source=tokens "data.path=$data/corpus/tokens.bin" data.token_dtype=uint32 \
    data.seq_len=2048 data.batch_size="${BATCH_1B:-4}" precision.policy=bf16-mixed optim.betas=[0.9,0.95] optim.weight_decay=0.0 \
    metrics.console=false ${RECIPE[$name]}
  mkdir -p "$R/profile" && cp "$out/profile_summary.md" "$R/profile/" 2>/dev/null
}

i=0
for part in $parts; do
  i=$(( i + 1 ))
  left=$(( TOTAL - ($(date +%s) - start) ))
  share=$left  # the last part takes what is left; an earlier one its SHARE
  if [ "$i" -lt "$nparts" ] && [ "${SHARE[$part]:-0}" -lt "$left" ]; then share=${SHARE[$part]}; fi
  echo "=== part $part: $share s of the $left s left"
  run_part "$part" "$share"
done
left=$(( TOTAL - ($(date +%s) - start) ))
if [ -n "${PROFILE:-}" ] && [ "$left" -gt 90 ]; then profile_recipe "$PROFILE" $(( left - 15 )); fi
echo "=== done in $(( $(date +%s) - start )) s"
