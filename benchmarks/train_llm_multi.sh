#!/bin/bash
# LLM training on several GPUs of one node (issue 42): kiln's FSDP2 recipes vs the hand-written FSDP2
# loop vs torchtitan 0.2.2, and kiln's weak scaling. Run from the repo root on a 4-GPU machine, one
# part per device call (each fits 9 minutes with the installs and compiles):
#
#   PART=8b bash benchmarks/train_llm_multi.sh       # `kiln bench train-llm --nproc-per-node 4`:
#        Llama-3.1-8B shape, seq 8192, local batch 1 (global 4), bf16, STEPS_8B (30) steps, the first
#        WARMUP_8B (10) untimed; rows in order: kiln-sel (FSDP2 + per-block compile + selective AC),
#        plain (LlamaForCausalLM, fully_shard per layer then the root, per-layer torch.compile, fused
#        AdamW, clip 1.0, bf16 params / fp32 reductions, transformers' full AC: without AC its
#        activations at seq 8192 do not fit), torchtitan (FSDP2 over 4, its compile, per-op selective
#        AC), kiln-full (full AC). Every row from the same initial weights on the same tokens; no row
#        starts past the deadline. Writes $OUT/r/8b/results.{json,md} and $OUT/r/8b/logs.tgz (each
#        row's own log and torchtitan's job).
#   PART=8b-float8 bash benchmarks/train_llm_multi.sh  # the same shape and call, float8 on both sides:
#        rows kiln-sel (bf16 reference), kiln-fp8 (kiln-sel with precision.float8=tensorwise) and
#        torchtitan with its float8 converter (tensorwise, float8 all-gather of the FSDP2 weights,
#        precomputed scales); STEPS_8B default 40 here; BASELINE_8B (default kiln-sel) names the row the
#        others are compared with, e.g. KILN_ROWS_8B=kiln-master-sel,kiln-master-fp8,torchtitan
#        BASELINE_8B=kiln-master-sel for bf16-master with and without float8. Writes $OUT/r/8b-float8/.
#   PART=1b-weak bash benchmarks/train_llm_multi.sh  # `kiln bench scale` of the Llama-3.2-1B shape,
#        NPROCS_1B (1,4) ranks, weak scaling (seq 2048, batch 4 per rank, synthetic tokens) with
#        RECIPE_1B (default kiln's fastest one-GPU recipe: bf16-master, compiled model and loss,
#        Triton cross-entropy): the 1-rank baseline runs it without a wrapper, the fsdp points under
#        FSDP2. Writes $OUT/r/1b-weak/results.{json,md} (efficiency per point, exposed communication).
#
#   PART=1b-variants bash benchmarks/train_llm_multi.sh  # the same 1B shape and recipe, which FSDP2 setup
#        loses least to the unwrapped GPU: --nprocs 1,NPROCS_1B_VAR (4) with the default (model and loss
#        compiled as one function: dynamo splits it at FSDP2's hooks), `blocks` (compile.scope=model: each
#        block compiled) and `zero2` (distributed.fsdp_reshard_after_forward=false); each variant also at
#        1 rank (its wrapper cost). Writes $OUT/r/1b-variants/. 7 points, about 7 minutes.
#   PART=8b-save bash benchmarks/train_llm_multi.sh  # `kiln train --nproc-per-node 4` of the 8B shape
#        (bf16-master, selective AC, seq 8192) for STEPS_SAVE (70) steps with an async DCP checkpoint
#        every SAVE_EVERY (30) steps, keep 1: each save's stall on the training step and its total time
#        (summary.json's checkpoint_saves). Writes $OUT/r/8b-save/{summary.json,saves.jsonl,
#        checkpoint_bytes.txt} and $OUT/r/train_8b_save.log. PART=1b-weak+8b-save runs both parts.
#        EXTRA_SAVE: more KEY=VALUE overrides for its `kiln train` (e.g. checkpoint.writer_threads=4).
#
# DRY=1 PART=8b (or 8b-save) runs part 8b's command on the CPU (2 gloo ranks, a tiny Llama, STEPS_8B=4 WARMUP_8B=1
# LR_WARMUP_8B=2 KILN_ROWS_8B=kiln-sel,plain): a check of the script, not a measurement.
# Env: KILN_ROWS_8B (default kiln-sel,plain,torchtitan,kiln-full: names from the RECIPE table below, e.g.
# kiln-master-sel (bf16-master; its fsdp_reshard_after_forward=auto keeps the units gathered where the memory plan
# leaves room), kiln-master-sel-zero2 (the same with fsdp_reshard_after_forward=false everywhere) and
# kiln-master-sel-cudnn (the same with model.attention=cudnn, the kernel
# torchtitan's attention asks SDPA for first), kiln-master-none(-zero2) (no activation checkpointing), or plain /
# torchtitan / torchtitan-noac / torchtitan-full (torchtitan with activation_checkpoint.mode none / full)),
# NO_TORCHTITAN=1, PLAIN_AC_8B (full | none), TOTAL_S (default 530: the part's
# seconds, the bench starts no row past TOTAL_S - TAIL_S, TAIL_S default 150 for 8b), EXTRA_8B (more
# `kiln bench train-llm` flags, e.g. "--torchtitan-set model.converters=[\"quantize.linear.float8\"]
# --torchtitan-set quantize.linear.float8.recipe_name=tensorwise" for torchtitan's float8 row beside a
# kiln float8 recipe: KILN_ROWS_8B=kiln-fp8,torchtitan).
# Needs .whl/ carried: tomli_w, torchtitan 0.2.2 and its dependencies (torchdata, datasets 4.5.0,
# dill, multiprocess, xxhash, tyro and its dependencies, einops, tomli, fsspec), torchao 0.17.0,
# liger-kernel. datasets also needs pyarrow and pandas: the script says at once if the image lacks
# them (the torchtitan row then fails on its own; the other rows run). The corpus, tokenizer and the
# 8B's initial weights (32 GB, fp32) are written under /tmp at run time.
set -uo pipefail
if [ -n "${DRY:-}" ]; then  # a tiny Llama config for the CPU check
  DRY_MODEL=/tmp/kiln-multi-dry.json
  printf '%s' '{"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256, "rms_norm_eps": 1e-05, "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2}' > "$DRY_MODEL"
fi
source benchmarks/device_env.sh
start=$(date +%s)
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
TOTAL=${TOTAL_S:-530}
for mod in torchtitan datasets pyarrow pandas torchao liger_kernel; do
  python3 -c "import $mod, importlib.metadata as m; print('$mod', getattr($mod, '__version__', ''))" 2>&1 | tail -1
done
nvidia-smi --query-gpu=index,name,power.limit,memory.total --format=csv 2>/dev/null

# Kiln recipes of part 8b: NAME: overrides on the bench's base config (kiln's llama decoder, bf16-mixed).
declare -A RECIPE=(
  [kiln-sel]="distributed.strategy=fsdp compile.enabled=true compile.regional=true training.activation_checkpointing=selective"
  [kiln-full]="distributed.strategy=fsdp compile.enabled=true compile.regional=true training.activation_checkpointing=full"
  [kiln-master-sel]="distributed.strategy=fsdp compile.enabled=true compile.regional=true training.activation_checkpointing=selective precision.policy=bf16-master"
  [kiln-master-sel-zero2]="distributed.strategy=fsdp compile.enabled=true compile.regional=true training.activation_checkpointing=selective precision.policy=bf16-master distributed.fsdp_reshard_after_forward=false"
  [kiln-master-sel-cudnn]="distributed.strategy=fsdp compile.enabled=true compile.regional=true training.activation_checkpointing=selective precision.policy=bf16-master model.attention=cudnn"
  [kiln-master-none]="distributed.strategy=fsdp compile.enabled=true compile.regional=true training.activation_checkpointing=none precision.policy=bf16-master"
  [kiln-master-none-zero2]="distributed.strategy=fsdp compile.enabled=true compile.regional=true training.activation_checkpointing=none precision.policy=bf16-master distributed.fsdp_reshard_after_forward=false"
  [kiln-fp8]="distributed.strategy=fsdp compile.enabled=true compile.regional=true training.activation_checkpointing=selective precision.float8=tensorwise"
  [kiln-master-fp8]="distributed.strategy=fsdp compile.enabled=true compile.regional=true training.activation_checkpointing=selective precision.policy=bf16-master precision.float8=tensorwise"
)

# Peer rows with settings of their own (`--peer-recipe`), named in KILN_ROWS_8B like the recipes above.
declare -A PEER_RECIPE=(
  [torchtitan-noac]="torchtitan activation_checkpoint.mode=none"
  [torchtitan-full]="torchtitan activation_checkpoint.mode=full"
)

# torchtitan 0.2.2's float8 is tensorwise when no recipe_name is set, and it refuses a recipe_name beside
# the float8 all-gather ("not supported").
TITAN_FP8=(--torchtitan-set 'model.converters=["quantize.linear.float8"]'
           --torchtitan-set quantize.linear.float8.enable_fsdp_float8_all_gather=true
           --torchtitan-set quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp=true)

part_8b() {  # part_8b NAME DEFAULT_ROWS [FLAGS...]
  local part=$1 data=/tmp/kiln-train-llm-multi-$1 rows=${KILN_ROWS_8B:-$2} recipes=() name
  shift 2
  if [ -n "${NO_TORCHTITAN:-}" ]; then  # every torchtitan row left out
    local kept=""
    for name in ${rows//,/ }; do [[ $name == torchtitan* ]] || kept+=${kept:+,}$name; done
    rows=$kept
  fi
  rm -rf "$data"
  for name in ${rows//,/ }; do
    [ -n "${RECIPE[$name]:-}" ] && recipes+=(--recipe "$name: ${RECIPE[$name]}")
    [ -n "${PEER_RECIPE[$name]:-}" ] && recipes+=(--peer-recipe "$name: ${PEER_RECIPE[$name]}")
  done
  local left=$(( TOTAL - ($(date +%s) - start) ))
  local deadline=$(( left - ${TAIL_S:-150} ))
  # shellcheck disable=SC2086  # EXTRA_8B holds several flags
  local shape=(--model llama-3.1-8b --seq-len 8192 --batch-size 1 --nproc-per-node 4)
  # DRY=1: the same command on the CPU, 2 gloo ranks of a tiny Llama (checks the script, not speed).
  [ -n "${DRY:-}" ] && shape=(--model "$DRY_MODEL" --seq-len 16 --batch-size 2 --nproc-per-node 2 --device cpu)
  step "train_llm_multi_$part" timeout -k 20 $(( left - 10 )) python3 -m kiln bench train-llm "${shape[@]}" \
    --steps "${STEPS_8B:-30}" --warmup "${WARMUP_8B:-10}" --lr-warmup "${LR_WARMUP_8B:-10}" --rows "$rows" \
    "${recipes[@]}" --plain-ac "${PLAIN_AC_8B:-full}" --skip-invalid-recipes --deadline-s "$deadline" \
    --row-timeout-s 270 --torchtitan-timeout-s 270 --data-dir "$data" --out "$R/$part" "$@" ${EXTRA_8B:-}
  tar czf "$R/$part/logs.tgz" -C "$data" --exclude='*.npy' --exclude='*.safetensors' --exclude=corpus \
    --exclude=outputs --exclude=init --exclude=hf_datasets_cache . 2>/dev/null
  rm -rf "$data"
}

part_8b_save() {  # kiln train at 8B with async checkpoints: each save's stall on the step and total time
  local run=/tmp/kiln-8b-save steps=${STEPS_SAVE:-70} every=${SAVE_EVERY:-30} shape
  shape=(model.name=llama:llama-3.1-8b data.seq_len=8192 data.batch_size=1)
  [ -n "${DRY:-}" ] && shape=("model.name=llama:$DRY_MODEL" data.seq_len=16 data.batch_size=2 training.device=cpu)
  rm -rf "$run"
  local left=$(( TOTAL - ($(date +%s) - start) ))
  # shellcheck disable=SC2086  # EXTRA_SAVE holds several overrides
  step train_8b_save timeout -k 20 $(( left - 25 )) python3 -m kiln train --nproc-per-node "${NPROC_SAVE:-4}" \
    --run-dir "$run" "${shape[@]}" distributed.strategy=fsdp compile.enabled=true compile.regional=true \
    precision.policy=bf16-master training.activation_checkpointing=selective "training.steps=$steps" \
    training.log_interval=5 metrics.tensorboard=false "checkpoint.interval=$every" checkpoint.async_save=true \
    checkpoint.keep=1 checkpoint.save_final=false ${EXTRA_SAVE:-}
  mkdir -p "$R/8b-save"
  cp "$run/summary.json" "$R/8b-save/summary.json" 2>/dev/null
  grep -h "ckpt\|checkpoint" "$run"/metrics.jsonl 2>/dev/null | tail -20 > "$R/8b-save/saves.jsonl"
  du -sb "$run"/checkpoints/* 2>/dev/null > "$R/8b-save/checkpoint_bytes.txt"
  echo "files: $(find "$run"/checkpoints -type f 2>/dev/null | wc -l)" >> "$R/8b-save/checkpoint_bytes.txt"
  rm -rf "$run"
}

part_1b_variants() {  # the 1B's FSDP2 recipes at NPROCS_1B_VAR (4) ranks beside the unwrapped one-GPU baseline
  local left=$(( TOTAL - ($(date +%s) - start) ))
  step scale_1b_variants timeout -k 20 $(( left - 10 )) python3 -m kiln bench scale --model llama:llama-3.2-1b \
    --nprocs "1,${NPROCS_1B_VAR:-4}" --strategies fsdp --weak --steps "${STEPS_1B:-40}" --timeout 150 --no-comm \
    --variant blocks=fsdp,compile.scope=model --variant zero2=fsdp,distributed.fsdp_reshard_after_forward=false \
    --thresholds "${NPROCS_1B_VAR:-4}:95" --out "$R/1b-variants" data.seq_len=2048 data.batch_size=4 \
    compile.enabled=true compile.scope=model+loss training.ce_kernel=triton precision.policy=bf16-master
}

part_1b_weak() {
  local recipe=${RECIPE_1B:-compile.enabled=true compile.scope=model+loss training.ce_kernel=triton precision.policy=bf16-master}
  local left=$(( TOTAL - ($(date +%s) - start) ))
  # shellcheck disable=SC2086  # the recipe is several KEY=VALUE overrides
  step scale_1b_weak timeout -k 20 $(( left - 10 )) python3 -m kiln bench scale --model llama:llama-3.2-1b \
    --nprocs "${NPROCS_1B:-1,4}" --strategies fsdp --weak --steps "${STEPS_1B:-40}" --timeout 200 \
    --thresholds 2:95,4:95 --out "$R/1b-weak" data.seq_len=2048 data.batch_size=4 $recipe
}

case ${PART:-8b} in
  8b) part_8b 8b kiln-sel,plain,torchtitan,kiln-full ;;
  8b-float8) STEPS_8B=${STEPS_8B:-40} part_8b 8b-float8 kiln-sel,kiln-fp8,torchtitan --baseline "${BASELINE_8B:-kiln-sel}" "${TITAN_FP8[@]}" ;;
  1b-weak) part_1b_weak ;;
  8b-save) part_8b_save ;;
  1b-variants) part_1b_variants ;;
  1b-weak+8b-save) part_1b_weak; part_8b_save ;;
  *) echo "PART must be 8b, 8b-float8, 1b-weak, 1b-variants, 8b-save or 1b-weak+8b-save, got '${PART:-}'" >&2; exit 2 ;;
esac
echo "=== done in $(( $(date +%s) - start )) s"
