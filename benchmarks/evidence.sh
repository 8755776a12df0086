#!/bin/bash
# Evidence for kiln's own baselines and ceilings on one GPU, each half one device call (~8-9 min each
# on an H100):
#   PARTS=plain bash benchmarks/evidence.sh
#   PARTS=llm BUDGET=555 bash benchmarks/evidence.sh
# (KILN_QUANT and GPT_FAST_QUANT pick the LLM rows, BUDGET the seconds all steps may take.)
# 1. plain: timm ViT-B/16 (b64 bf16-mixed, default mode) and the seed MLP (b128 fp32,
#    reduce-overhead) through `kiln bench compile --baseline plain`, with training.grad_clip=0 and
#    =1, each bench bracketed by two runs of benchmarks/plain_crosscheck.py (the same loop without
#    kiln, same clip value, one process each) right before and after it, so a GPU that drifts over
#    the call moves both sides alike. Compile rows carry the datasheet and best-matmul fractions and
#    each compiled row's step_ms_alone. nvidia-smi samples SM clock, power and temperature every
#    second meanwhile ($R/gpu_clocks.csv).
# 2. llm: `kiln bench llm` on the Llama-3.2-3B shape (prompt 1024, 256 new tokens, prefill eager):
#    kiln-compiled bf16 and int4@triton beside gpt-fast bf16 and int4 (its own quantize.py) from
#    the checkout carried at .peers/gpt-fast; the ceilings (read-only stream, copy, best matmul,
#    datasheet) are in its results.json.
# Every step is time-boxed and fails soft. Writes $OUT/evidence.tgz (every result folder and log),
# $OUT/summary.json and $OUT/summary.md (benchmarks/evidence_summary.py).
set -uo pipefail
source benchmarks/device_env.sh
start=$(date +%s)
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
PARTS=${PARTS:-plain}
BUDGET=${BUDGET:-540}
left() { echo $(( BUDGET - ($(date +%s) - start) )); }
cap() { local l; l=$(left); echo $(( $1 < l ? $1 : l )); }
pack() { tar czf "$OUT/evidence.tgz" -C "$R" . 2>/dev/null; }
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"

if [[ $PARTS == *plain* ]]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -l 1 > "$R/gpu_clocks.csv" 2>/dev/null &
  smi=$!
  # One process per script run and clip value (a user's script trains one model), the bench between
  # two script runs of the same clip value.
  # The seed MLP's step is launch-bound (host time): its script and bench runs share one fixed set of
  # CPU cores, so neither depends on where the scheduler puts it. The ViT's script interleaves the
  # eager fp32 twin the bench times in every round of its bf16 rows (--fp32-twin).
  pin=(); command -v taskset >/dev/null && [ "$(nproc)" -ge 8 ] && pin=(taskset -c 2-7)
  xcheck() {  # xcheck MODEL MODE CLIP WHEN STEPS SECONDS [EXTRA...]
    local args=(--model "$1" --mode "$2" --clip "$3" --steps "$5" --append --out "$R/crosscheck_$4" "${@:7}")
    if [ "$1" = mlp ]; then
      step "crosscheck_$1_clip$3_$4" timeout "$(cap "$6")" "${pin[@]}" python3 benchmarks/plain_crosscheck.py "${args[@]}"
    else
      step "crosscheck_$1_clip$3_$4" timeout "$(cap "$6")" python3 benchmarks/plain_crosscheck.py "${args[@]}"
    fi
  }
  for clip in 0 1; do
    xcheck vit default $clip before 60 60 --fp32-twin
    step vit_clip$clip timeout "$(cap 100)" python3 -m kiln bench compile --preset seed001-vit \
      --model timm:vit_base_patch16_224 --precisions bf16-mixed --modes default --backends inductor --scopes model \
      --losses task --cudagraphs off --regional off --baseline plain --steps 60 --accuracy-steps 0 --warm-cache \
      --out "$R/vit_clip$clip" training.grad_clip=$clip
    xcheck vit default $clip after 60 40 --fp32-twin
  done
  pack
  for clip in 0 1; do
    xcheck mlp reduce-overhead $clip before 200 40
    step mlp_clip$clip timeout "$(cap 70)" "${pin[@]}" python3 -m kiln bench compile --preset seed000-levels --precisions fp32 \
      --modes reduce-overhead --cudagraphs off --baseline plain --steps 200 --accuracy-steps 0 --warm-cache \
      --out "$R/mlp_clip$clip" training.grad_clip=$clip
    xcheck mlp reduce-overhead $clip after 200 40
  done
  kill $smi 2>/dev/null
  pack
fi

l=$(left)
if [[ $PARTS == *llm* && $l -gt 120 ]]; then
  # gpt-fast's checkpoints (bf16, int4 by its quantize.py) are written first, kiln's rows start their
  # warm-up within the first 200 s, and gpt-fast's generation runs end 25 s before the process's
  # own limit, so the results are written either way.
  peer=(--gpt-fast .peers/gpt-fast --gpt-fast-quant "${GPT_FAST_QUANT:-none,int4}" --gpt-fast-timeout-s 300
        --end-by-s $(( l - 25 )))
  [ -f .peers/gpt-fast/generate.py ] || { echo "evidence.sh: no .peers/gpt-fast checkout: kiln rows only" >&2; peer=(); }
  step llm timeout "$l" python3 -m kiln bench llm --model llama-3.2-3b --prompt-len 1024 --new-tokens 256 \
    --prefill eager --repeats 3 --engines kiln-compiled --decode-attention triton --decode-matvec triton \
    --quant "${KILN_QUANT:-none,int4@triton}" --deadline-s 200 "${peer[@]}" --out "$R/llm"
  pack
fi

python3 benchmarks/evidence_summary.py "$R" --out "$OUT" --parts "$PARTS"
echo "=== done in $(( $(date +%s) - start )) s"
pack
