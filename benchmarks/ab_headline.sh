#!/bin/bash
# A/B of kiln's headline GPU figures for two source trees, interleaved in one device call, from the
# repo root of the device machine:
#   AB_A=.ab/base/src AB_A_COMMIT=<sha> AB_B_COMMIT=<sha> bash benchmarks/ab_headline.sh
# Tree B is this working tree (AB_B, default src); tree A an earlier commit's src/, carried as an
# ignored folder (git archive <commit> src | tar -x -C .ab/base; run(carry=['.ab', '.whl'])). Every
# case runs once per tree per round, A then B in odd rounds and B then A in even ones (A,B,B,A),
# each in its own process that warms up before it times; a figure is the median over a tree's runs.
# Cases (CASES, comma-separated, default all, in this order; one H100, tree A and B alike):
#   train_1b   kiln train of the Llama-3.2-1B shape (untied), seq 2048, batch 4, 40 steps, kiln's fastest
#              recipe (bf16-master, compile model+loss, Triton cross-entropy and SwiGLU), AdamW at
#              kiln bench train-llm's lr 1e-4 (random weights spike at higher rates): summary.json's
#              median ms/step (~60 s cold)
#   decode_3b  kiln bench llm, Llama-3.2-3B shape, batch 1 (DECODE_BATCH, e.g. 1,16: a figure per batch),
#              kiln-compiled at quant none and int4@triton (DECODE_QUANT), prompt 512, 128 new tokens, eager
#              prefill: decode tok/s (~95 s cold at batch 1)
#   mlp        kiln bench compile, seed MLP b128 fp32, regional default compile + whole-step capture:
#              ms/step (~25 s)
#   vit        kiln bench compile, ViT-B/16 b64 bf16-true, default compile + whole-step capture: ms/step (~45 s)
# Each tree has its own inductor/Triton/kiln compile caches (/tmp/kiln-ab-cache/<tree>): a tree's later
# rounds compile warm, and no tree runs code the other compiled. The call's time box is BUDGET_S
# (default 480 s): a run expected to take longer than what is left (its case's first run with that
# tree, else with the other tree, else EST_S_<CASE>) is skipped and recorded; rounds after the first
# take the cheapest pairs first and run a case's pair only when both runs fit. ROUNDS (default 2).
# Writes $OUT/ab/<case>/<tree><round>/ and runs.tsv, then benchmarks/ab_summary.py's $OUT/ab.json and
# $OUT/ab.md (per figure: each tree's median and spread, B/A, verdict: worse by more than TOL_PCT %,
# default 2, is flagged), all packed as $OUT/ab.tgz.
# AB_DRY=1 prints the schedule and every command without running anything; AB_TINY=1 runs every case
# on the CPU with tiny models (a smoke run of the script and the summary, minutes).
set -uo pipefail
AB_A=${AB_A:-.ab/base/src} AB_B=${AB_B:-src}
CASES=${CASES:-train_1b,decode_3b,mlp,vit} ROUNDS=${ROUNDS:-2} BUDGET_S=${BUDGET_S:-480} TOL_PCT=${TOL_PCT:-2}
DECODE_QUANT=${DECODE_QUANT:-none,int4@triton} DECODE_BATCH=${DECODE_BATCH:-1}
VALID="train_1b decode_3b mlp vit"
for c in ${CASES//,/ }; do
  [[ " $VALID " == *" $c "* ]] || { echo "ab_headline.sh: unknown case '$c' (${VALID// /, })" >&2; exit 2; }
done
for tree in "$AB_A" "$AB_B"; do
  [ -f "$tree/kiln/__init__.py" ] || [ "${AB_DRY:-0}" = 1 ] || {
    echo "ab_headline.sh: $tree/kiln is missing: carry the earlier commit's src/ (git archive <commit> src | tar -x -C .ab/base)" >&2
    exit 2; }
done
if [ "${AB_DRY:-0}" = 1 ]; then
  OUT=${OUT:-/tmp/kiln-out} start=$(date +%s)
else
  source benchmarks/device_env.sh  # $OUT, PYTHONPATH=src:<carried wheels>, nvidia-smi.csv
  export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
fi
start=${start:-$(date +%s)}
W=$OUT/ab
EXTRA_PATH=${PYTHONPATH:-}; EXTRA_PATH=${EXTRA_PATH#"$PWD/src"}; EXTRA_PATH=${EXTRA_PATH#:}

# The command of each case (into CMD), its first-round estimate (seconds) and its cap.
declare -A EST=([train_1b]=60 [decode_3b]=95 [mlp]=25 [vit]=45) CAP=([train_1b]=180 [decode_3b]=200 [mlp]=90 [vit]=120)
for c in $VALID; do v=EST_S_${c^^}; [ -n "${!v:-}" ] && EST[$c]=${!v}; done
if [ "${AB_TINY:-0}" = 1 ]; then
  DEV=(--device cpu) DECODE_QUANT=${AB_TINY_QUANT:-none}
  TRAIN=(model.name=llama:llama-tiny data.seq_len=64 data.batch_size=2 training.steps=8 training.log_interval=2
         precision.policy=fp32 training.device=cpu)
  DECODE=(--model llama-tiny --engines kiln-eager --prompt-len 16 --new-tokens 8 --repeats 2 --prefill-repeats 2)
  MLP=(--backends aot_eager --cudagraphs off --steps 4 model.kwargs.hidden_size=64 model.kwargs.num_layers=4
       data.batch_size=16)
  VIT=(--backends aot_eager --cudagraphs off --steps 4 model.kwargs.img_size=32 model.kwargs.patch_size=16
       model.kwargs.embed_dim=32 model.kwargs.depth=2 model.kwargs.num_heads=2 model.kwargs.num_classes=10
       data.batch_size=4)
else
  DEV=()
  TRAIN=(model.name=llama:llama-3.2-1b model.kwargs.tie_word_embeddings=false data.seq_len=2048 data.batch_size=4
         training.steps=40 training.log_interval=5 precision.policy=bf16-master compile.enabled=true
         compile.scope=model+loss training.ce_kernel=triton optim.lr=1e-4 optim.warmup_steps=10)
  DECODE=(--model llama-3.2-3b --engines kiln-compiled --prompt-len 512 --new-tokens 128 --repeats 3
          --prefill eager --tuning decode)
  MLP=(--backends inductor --cudagraphs on --steps 40 --warm-cache)
  VIT=(--backends inductor --cudagraphs on --steps 30 --warm-cache)
fi
case_cmd() {  # case_cmd CASE DIR: the case's command into CMD, writing into DIR
  case $1 in
    train_1b) CMD=(python3 -m kiln train --run-dir "$2" "${TRAIN[@]}" checkpoint.save_final=false metrics.console=false) ;;
    decode_3b) CMD=(python3 -m kiln bench llm "${DEV[@]}" "${DECODE[@]}" --batch "$DECODE_BATCH" --quant "$DECODE_QUANT" --out "$2") ;;
    mlp) CMD=(python3 -m kiln bench compile "${DEV[@]}" --preset seed000-levels --precisions fp32 --modes default
              --regional on --accuracy-steps 0 "${MLP[@]}" --out "$2") ;;
    vit) CMD=(python3 -m kiln bench compile "${DEV[@]}" --preset seed001-vit --precisions bf16-true --losses task
              --modes default --scopes model --regional off --accuracy-steps 0 "${VIT[@]}" --out "$2") ;;
  esac
}

left() { echo $(( BUDGET_S - ($(date +%s) - start) )); }
declare -A TOOK=()
cost() {  # cost CASE TREE: seconds a run is expected to take: its first run's, else the other tree's, else EST
  local other=a; [ "$2" = a ] && other=b
  echo "${TOOK[$1$2]:-${TOOK[$1$other]:-${EST[$1]}}}"
}
skipped() {  # skipped CASE TREE ROUND WHY: a run not started, recorded
  echo "=== round $3 $1 $2: skipped, $4"
  printf '%s\t%s\t%s\tskipped\t0\t%s\tnot started: %s\n' "$1" "$2" "$3" "$1/$2$3" "$4" >> "$W/runs.tsv"
}
one() {  # one CASE TREE ROUND: a run of CASE with TREE (a|b) in its own process, recorded in runs.tsv
  local c=$1 t=$2 r=$3 src cache rc t0 secs cap status=ok note=""
  src=$AB_B; [ "$t" = a ] && src=$AB_A; [[ $src == /* ]] || src=$PWD/$src
  cache=/tmp/kiln-ab-cache/$t
  case_cmd "$c" "$W/$c/$t$r"
  local env=(PYTHONPATH="$src${EXTRA_PATH:+:$EXTRA_PATH}" TORCHINDUCTOR_CACHE_DIR="$cache/inductor"
             TRITON_CACHE_DIR="$cache/triton" KILN_CACHE_DIR="$cache/kiln")
  if [ "${AB_DRY:-0}" = 1 ]; then echo "round $r $c $t: env ${env[*]} ${CMD[*]}"; return; fi
  if [ "$(left)" -lt "$(cost "$c" "$t")" ]; then
    skipped "$c" "$t" "$r" "$(cost "$c" "$t") s needed, $(left) s of BUDGET_S=$BUDGET_S left"; return
  fi
  cap=${CAP[$c]}; [ "$cap" -gt "$(left)" ] && cap=$(left)
  mkdir -p "$W/$c" "$cache"
  echo "=== round $r $c $t ($src): ${CMD[*]} (cap $cap s, +$(( $(date +%s) - start )) s)"
  t0=$(date +%s)
  env "${env[@]}" timeout -k 10 "$cap" "${CMD[@]}" > "$W/$c/$t$r.log" 2>&1
  rc=$?; secs=$(( $(date +%s) - t0 ))
  [ -n "${TOOK[$c$t]:-}" ] || TOOK[$c$t]=$secs
  grep -E "^kiln:|^\[" "$W/$c/$t$r.log" | grep -vE "^kiln: (cpu|strategy|GPU health)" | tail -4
  echo "=== round $r $c $t: exit $rc after $secs s"
  [ "$rc" = 0 ] || { status=failed; note="exit $rc$([ "$rc" = 124 ] && echo ": past its cap of $cap s"), log $c/$t$r.log"; }
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$t" "$r" "$status" "$secs" "$c/$t$r" "$note" >> "$W/runs.tsv"
  tar czf "$OUT/ab.tgz" -C "$W" .
}

# Fresh outputs and caches: a warm machine may hold another tree's compiled artefacts from an earlier call.
[ "${AB_DRY:-0}" = 1 ] || { rm -rf "$W" /tmp/kiln-ab-cache; mkdir -p "$W"; : > "$W/runs.tsv"; }
for r in $(seq 1 "$ROUNDS"); do
  first=a second=b; [ $(( r % 2 )) = 0 ] && first=b second=a
  order=${CASES//,/ }
  if [ "$r" -gt 1 ]; then  # later rounds: the cheapest pairs first, so most cases get a second pair
    order=$(for c in $order; do echo "$(( $(cost "$c" a) + $(cost "$c" b) )) $c"; done | sort -n | cut -d' ' -f2)
  fi
  for c in $order; do
    need=$(( $(cost "$c" a) + $(cost "$c" b) ))
    if [ "$r" -gt 1 ] && [ "${AB_DRY:-0}" != 1 ] && [ "$(left)" -lt "$need" ]; then  # both runs of a pair, or neither
      for t in a b; do skipped "$c" "$t" "$r" "the pair needs $need s, $(left) s of BUDGET_S=$BUDGET_S left"; done
      continue
    fi
    one "$c" "$first" "$r"; one "$c" "$second" "$r"
  done
done
SUMMARY=(python3 benchmarks/ab_summary.py "$W" --out "$W/summary" --decode-quant "$DECODE_QUANT" --decode-batch "$DECODE_BATCH" --tol-pct "$TOL_PCT"
         --a-label "${AB_A_LABEL:-A}" --b-label "${AB_B_LABEL:-B}" --a-commit "${AB_A_COMMIT:-unknown}"
         --b-commit "${AB_B_COMMIT:-unknown}" --a-tree "$AB_A" --b-tree "$AB_B")
if [ "${AB_DRY:-0}" = 1 ]; then echo "summary: ${SUMMARY[*]}"; exit 0; fi
"${SUMMARY[@]}" && cp "$W/summary/results.json" "$OUT/ab.json" && cp "$W/summary/results.md" "$OUT/ab.md"
tar czf "$OUT/ab.tgz" -C "$W" .
echo "=== done in $(( $(date +%s) - start )) s"
