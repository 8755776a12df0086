#!/bin/bash
# Evidence for kiln's own baselines and ceilings, on one GPU in one call (~8.5 min on an H100):
#   bash benchmarks/evidence.sh            (PARTS=plain or PARTS=llm runs one half; KILN_QUANT and
#                                           GPT_FAST_QUANT pick the LLM rows, BUDGET the seconds of steps)
# 1. plain: the seed MLP (b128 fp32, reduce-overhead) and timm ViT-B/16 (b64 bf16-mixed, default
#    mode) through `kiln bench compile --baseline plain`, with training.grad_clip=1 and =0, and
#    benchmarks/plain_crosscheck.py (the same loop without kiln) for both clip values. Compile
#    rows carry the datasheet and best-matmul fractions and each compiled row's step_ms_alone.
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
PARTS=${PARTS:-plain,llm}
BUDGET=${BUDGET:-510}
left() { echo $(( BUDGET - ($(date +%s) - start) )); }
cap() { local l; l=$(left); echo $(( $1 < l ? $1 : l )); }
pack() { tar czf "$OUT/evidence.tgz" -C "$R" . 2>/dev/null; }
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"

if [[ $PARTS == *plain* ]]; then
  for clip in 1 0; do
    step mlp_clip$clip timeout "$(cap 70)" python3 -m kiln bench compile --preset seed000-levels --precisions fp32 \
      --modes reduce-overhead --cudagraphs off --baseline plain --steps 40 --accuracy-steps 0 --warm-cache \
      --out "$R/mlp_clip$clip" training.grad_clip=$clip
  done
  step crosscheck_mlp timeout "$(cap 50)" python3 benchmarks/plain_crosscheck.py --model mlp --mode reduce-overhead \
    --clip 0,1 --steps 40 --out "$R/crosscheck"
  pack
  for clip in 0 1; do
    step vit_clip$clip timeout "$(cap 90)" python3 -m kiln bench compile --preset seed001-vit \
      --model timm:vit_base_patch16_224 --precisions bf16-mixed --modes default --backends inductor --scopes model \
      --losses task --cudagraphs off --regional off --baseline plain --steps 20 --accuracy-steps 0 --warm-cache \
      --out "$R/vit_clip$clip" training.grad_clip=$clip
  done
  step crosscheck_vit timeout "$(cap 60)" python3 benchmarks/plain_crosscheck.py --model vit --mode default \
    --clip 0,1 --steps 20 --out "$R/crosscheck"
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

python3 benchmarks/evidence_summary.py "$R" --out "$OUT"
echo "=== done in $(( $(date +%s) - start )) s"
pack
