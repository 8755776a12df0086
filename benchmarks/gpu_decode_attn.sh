#!/bin/bash
# The flash decode attention (kiln.llm.decode_attention) on one GPU, in one call (~9 min on an H100):
#   bash benchmarks/gpu_decode_attn.sh
# 1. benchmarks/decode_attention_check.py: FlashAttention's varlen kernel against the matmul path on
#    the 3B attention shape (4 layers), a left-padded batch of 3, eager steps vs an fp32 copy, then
#    compiled + CUDA-graphed greedy generation with each kernel (the eager part is written first;
#    the two compiles took longer than the 150 s cap on 2026-11-24).
# 2. kiln bench llm on the Llama-3.2-3B shape (bf16, batch 1, prompt 1024, 256 new tokens),
#    kiln-compiled at quant none and int4 with --decode-attention flash, and a profile of 32
#    replayed decode steps per row (kernels, gaps, bandwidth while busy) (~4-5 min cold).
# 3. The same rows with --decode-attention matmul (the default), shorter: inductor's caches
#    from (2) serve every kernel the two share (~2-3 min); cut at the call's end if time runs out.
# Writes $OUT/r/<name>/... and logs; packs $OUT/decode_attn.tgz after each part.
set -uo pipefail
source benchmarks/gpu_env.sh
start=$(date +%s)
source benchmarks/gpu_step.sh
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
left() { echo $(( ${1} - ($(date +%s) - start) )); }  # left BUDGET_S: seconds of it not yet spent
pack() { tar czf "$OUT/decode_attn.tgz" -C "$R" .; }
COMMON=(--model llama-3.2-3b --prompt-len 1024 --new-tokens 256 --prefill eager --repeats 3
        --engines kiln-compiled --quant none,int4)
step check timeout 150 python3 benchmarks/decode_attention_check.py --out "$R/decode_attention_check"
pack
step bench_flash timeout 300 python3 -m kiln bench llm "${COMMON[@]}" --decode-attention flash --profile-decode 32 \
  --deadline-s 200 --out "$R/bench_flash"
pack
cap=$(left 570)
if [ "$cap" -gt 90 ]; then
  step bench_matmul timeout "$cap" python3 -m kiln bench llm "${COMMON[@]}" --decode-attention matmul \
    --deadline-s $(( cap - 80 )) --out "$R/bench_matmul"
fi
python3 - "$R" <<'EOF'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("bench_*/results.json")):
    for r in json.loads(path.read_text())["results"]:
        fig = lambda k, f: format(r[k], f) if r.get(k) is not None else "-"
        print(f"{path.parent.name:13} {r['engine']}[{r['quant']}] {r['status']:8} decode {fig('decode_tok_s', '7.1f')} "
              f"tok/s  roofline {fig('roofline_frac', '.3f')}  attention {r.get('decode_attention', '-')}")
EOF
echo "=== done in $(( $(date +%s) - start )) s"
pack
