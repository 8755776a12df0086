#!/bin/bash
# LLM training on one GPU: kiln's recipes vs the plain transformers loop vs torchtitan 0.2.2, each
# `kiln bench train-llm` call one process (torchtitan in its own), every row from the same initial
# weights on the same tokens. Run from the repo root on the device machine, one part per call:
#
#   PART=1b bash benchmarks/train_llm.sh      # ~6 min: Llama-3.2-1B shape (untied: torchtitan cannot
#                                             # tie), seq 2048, batch 4, bf16, 50 steps: plain, kiln
#                                             # recipes, torchtitan; losses compared after 50 steps
#   PART=long bash benchmarks/train_llm.sh    # ~4 min: the 1B shape at seq 8192, batch 1, 20 steps:
#                                             # kiln recipes (tokens/s, memory) and the plain loop
#   PART=float8 bash benchmarks/train_llm.sh  # ~5 min: Llama-3.2-3B shape, seq 2048, batch 4, 100 steps:
#                                             # kiln bf16 vs float8 tensorwise vs rowwise (torchao)
#   PART=features bash benchmarks/train_llm.sh  # benchmarks/llm_train_features.py on the 1B shape: the
#                                             # cross-entropy kernels and activation checkpointing modes
#                                             # each on their own (time, memory, differences)
#
# Needs .whl/ carried (tomli_w, torchao, torchtitan 0.2.2 and its dependencies, liger-kernel). The
# corpus, tokenizer and initial weights are generated at run time under /tmp (not carried).
# KILN_ROWS=a,b,... runs only those kiln recipes of the part. Every row fails on its own (status
# error/oom with the reason); each part ends by printing its table. Writes $OUT/r/<part>/results.*,
# the log and torchtitan's log; packs $OUT/train_llm_<part>.tgz.
set -uo pipefail
source benchmarks/gpu_env.sh
start=$(date +%s)
source benchmarks/gpu_step.sh
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
part=${PART:-1b}
data=/tmp/kiln-train-llm-$part
rm -rf "$data"
python3 -c "import torchtitan, importlib.metadata as m; print('torchtitan', m.version('torchtitan'))" 2>&1 | tail -1
python3 -c "import liger_kernel, importlib.metadata as m; print('liger-kernel', m.version('liger-kernel'))" 2>&1 | tail -1

# Kiln recipes: NAME: overrides on the bench's base config (kiln's own llama decoder, bf16-mixed).
# FLOAT8_AC: activation checkpointing of the float8 part's three rows (default selective: the 3B
# training state alone takes ~51 GB; `full` if selective runs out of memory on an 80 GB GPU).
ac8=${FLOAT8_AC:-selective}
declare -A RECIPE=(
  [kiln]="compile.enabled=true"
  [kiln-regional]="compile.enabled=true compile.regional=true"
  [kiln-liger]="compile.enabled=true compile.regional=true training.ce_kernel=liger"
  [kiln-fsdp-bf16]="compile.enabled=true distributed.strategy=fsdp distributed.fsdp_param_dtype=bf16"
  [kiln-ac]="compile.enabled=true compile.regional=true training.activation_checkpointing=selective"
  [kiln-bf16]="compile.enabled=true compile.regional=true training.activation_checkpointing=$ac8"
  [kiln-fp8-tensorwise]="compile.enabled=true compile.regional=true training.activation_checkpointing=$ac8 precision.float8=tensorwise"
  [kiln-fp8-rowwise]="compile.enabled=true compile.regional=true training.activation_checkpointing=$ac8 precision.float8=rowwise"
)
if [ "$part" = features ]; then
  step train_llm_features timeout 500 python3 benchmarks/llm_train_features.py --out "$R/features" --compile
  echo "=== done in $(( $(date +%s) - start )) s"
  tar czf "$OUT/train_llm_$part.tgz" -C "$R" .
  exit 0
fi
case $part in
  1b) kiln_rows=kiln-regional,kiln,kiln-liger,kiln-fsdp-bf16 ;;
  long) kiln_rows=kiln-regional,kiln-ac ;;
  float8) kiln_rows=kiln-bf16,kiln-fp8-tensorwise,kiln-fp8-rowwise ;;
  *) echo "PART must be 1b, long, float8 or features, got '$part'" >&2; exit 2 ;;
esac
kiln_rows=${KILN_ROWS:-$kiln_rows}
recipes=()
for name in ${kiln_rows//,/ }; do recipes+=(--recipe "$name: ${RECIPE[$name]}"); done

case $part in
  # torchtitan after the first kiln recipe: a slow compile late in the call must not cost the peer row.
  1b) first=${kiln_rows%%,*}; rest=${kiln_rows#"$first"}
      args=(--model llama-3.2-1b --seq-len 2048 --batch-size 4 --steps 50 --warmup 10
            --rows "plain,$first,torchtitan$rest" --deadline-s 400 --torchtitan-timeout-s 240) ;;
  long) args=(--model llama-3.2-1b --seq-len 8192 --batch-size 1 --steps 20 --warmup 5 --lr-warmup 5
              --rows "$kiln_rows,plain" --deadline-s 400) ;;
  float8) args=(--model llama-3.2-3b --seq-len 2048 --batch-size 4 --steps 100 --warmup 10
                --rows "$kiln_rows" --baseline kiln-bf16 --deadline-s 400) ;;
esac
step "train_llm_$part" python3 -m kiln bench train-llm "${args[@]}" "${recipes[@]}" --skip-invalid-recipes \
  --data-dir "$data" --out "$R/$part"
cp "$data/torchtitan/torchtitan.log" "$R/$part/torchtitan.log" 2>/dev/null
cp "$data/torchtitan/job.toml" "$R/$part/torchtitan_job.toml" 2>/dev/null
echo "=== done in $(( $(date +%s) - start )) s"
tar czf "$OUT/train_llm_$part.tgz" -C "$R" .
