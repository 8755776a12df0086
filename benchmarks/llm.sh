#!/bin/bash
# LLM inference: kiln's engine against transformers, its decode kernels and quantized decode, on one GPU,
# from the repo root of the device machine (carry .whl/: tomli_w, torchao; bitsandbytes for nf4 rows):
#   PART=seed002 bash benchmarks/llm.sh          # several parts comma-separated run one after the other
# Every bench row is Llama-3.2-3B shape (random weights), bf16, batch 1, prompt 1024, 256 new tokens
# unless said otherwise. Parts (time on one H100):
#   seed002     kiln vs transformers logits and fp32 greedy tokens with identical weights
#               (benchmarks/llm_parity.py), then `kiln bench llm --preset seed002-llama3b`: hf-eager,
#               hf-compiled, kiln-eager, kiln-compiled in one process -> results/h100/llm/parity_3b,
#               seed002_llama3b (~6-7 min)
#   smoke       the parity check and kiln-eager/kiln-compiled on the 1B shape, 64 new tokens: GPU-only
#               failures (CUDA graph capture, Triton kernels) cheaply -> results/h100/llm/smoke_1b (~2-3 min)
#   decode-profile  --profile-decode 64 beside hf-compiled (kernels per step, idle gaps, bandwidth while
#               busy), then the kiln row with inductor's programmatic dependent launch
#               (--inductor triton.enable_pdl=true) -> results/h100/llm/decode_profile_3b (~6-7 min)
#   attention   decode attention kernels: benchmarks/decode_attention_check.py (eager paths against an
#               fp32 copy on a padded batch), then kiln bench llm per kernel in KERNELS (default
#               "triton matmul"; ENGINES, QUANT pick rows) -> results/h100/llm/decode_attention (~9 min)
#   attention-kernels  benchmarks/decode_attention_bench.py (one layer's decode attention per kernel and a
#               sweep of the Triton kernel's launch settings), the 3B decode with --decode-attention triton
#               at quant none,int4, and a wider coordinate-descent search -> results/h100/llm/decode_kernels (~7-8 min)
#   fused       seed 002's table with --decode-matvec $MATVEC (default triton) and a profile of 32 decode
#               steps, then kiln-compiled with --decode-matvec inductor at quant $QUANT (default none,int4)
#               -> results/h100/llm/decode_matvec/7_fused_attention, 10_angles_in_kernel (~8 min)
#   matvec      benchmarks/matvec_bench.py (per projection against inductor and cuBLAS, chained in one
#               CUDA graph; MICRO=0 skips it, INT4=1 adds int4 rows), then kiln bench llm once per
#               --decode-matvec in $MATVECS (default "triton inductor") -> results/h100/llm/decode_matvec/3_* (~7 min)
#   int4        benchmarks/int4_matvec_bench.py (int4@triton against tinygemm per projection; SKIP_MATVEC=1
#               skips it), then kiln bench llm at quant $QUANT (default none,int4@triton,int4), RUNS times
#               in their own processes -> results/h100/llm/decode_matvec/{11,13,14,23,24}_* (~3.5 min)
#   confirm     second readings: decode_attention_check.py with the compiled engines, then seed 002's shape
#               hf-compiled beside kiln-compiled with every default (~5 min)
#   quant       weight-only quantized decode, MODE=h100 (default: 3B shape, kiln-compiled at none, int4,
#               int8, int4@inductor, nf4, then hf-compiled; ~7-8 min -> results/h100/llm/quant_3b),
#               MODE=h200-8b (Llama-3.1-8B shape on one H200 -> results/h200/llm/quant_8b), MODE=dry (both
#               modes' flags on a tiny config on the CPU, ~2-3 min); QUANT, ENGINES, DEADLINE, ATTN narrow it
# Peers: gpt-fast beside kiln is benchmarks/evidence.sh's llm part; training is benchmarks/train_llm.sh;
# the real-text model (train, export, serve) is benchmarks/llm_real_text.sh.
# Each part writes $OUT/r/<name>/results.{json,md,png} with logs and packs $OUT/<part>.tgz after each step.
set -uo pipefail
VALID="seed002 smoke decode-profile attention attention-kernels fused matvec int4 confirm quant"
for part in ${PART//,/ }; do
  [[ " $VALID " == *" $part "* ]] || { echo "llm.sh: unknown PART '$part' (${VALID// /, })" >&2; exit 2; }
done
[ -n "${PART:-}" ] || { echo "llm.sh: PART is required (${VALID// /, })" >&2; exit 2; }
source benchmarks/device_env.sh  # $OUT/r as $R, carried wheels, PYTHONPATH, nvidia-smi.csv, step
left() { echo $(( ${1} - ($(date +%s) - start) )); }  # left BUDGET_S: seconds of it not yet spent

seed002() {
  local part=$1
  if [ "$part" = smoke ]; then
    step llm_parity_1b python3 benchmarks/llm_parity.py --model llama-3.2-1b --greedy-steps 16 --out "$R/llm_parity_1b"
    step bench_llm_smoke_1b python3 -m kiln bench llm --model llama-3.2-1b --engines kiln-eager,kiln-compiled \
      --prompt-len 1024 --new-tokens 64 --repeats 2 --out "$R/bench_llm_smoke_1b"
  else
    step llm_parity_3b python3 benchmarks/llm_parity.py --model llama-3.2-3b --out "$R/llm_parity_3b"
    step bench_llm_seed002_llama3b python3 -m kiln bench llm --preset seed002-llama3b --out "$R/bench_llm_seed002_llama3b"
  fi
  tar czf "$OUT/results.tgz" -C "$R" .
}

decode_profile() {
  local COMMON=(--model llama-3.2-3b --prompt-len 1024 --new-tokens 256 --prefill eager --tuning decode --repeats 3
                --profile-decode 64)
  step decode_3b timeout 330 python3 -m kiln bench llm "${COMMON[@]}" --engines hf-compiled,kiln-compiled --out "$R/decode_3b"
  step decode_3b_pdl timeout 300 python3 -m kiln bench llm "${COMMON[@]}" --engines kiln-compiled \
    --inductor triton.enable_pdl=true --out "$R/decode_3b_pdl"
  tar czf "$OUT/results.tgz" -C "$R" .
}

attention() {
  local -x TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
  local kernels kernel cap
  read -r -a kernels <<< "${KERNELS:-triton matmul}"
  pack() { tar czf "$OUT/decode_attn.tgz" -C "$R" .; }
  local COMMON=(--model llama-3.2-3b --prompt-len 1024 --new-tokens 256 --prefill eager --repeats 3
                --engines "${ENGINES:-kiln-compiled}" --quant "${QUANT:-none,int4}")
  step check timeout 120 python3 benchmarks/decode_attention_check.py --compiled "" --out "$R/decode_attention_check"
  pack
  step "bench_${kernels[0]}" timeout 320 python3 -m kiln bench llm "${COMMON[@]}" --decode-attention "${kernels[0]}" \
    --profile-decode 32 --deadline-s 200 --out "$R/bench_${kernels[0]}"
  pack
  for kernel in "${kernels[@]:1}"; do
    cap=$(left 570)
    if [ "$cap" -gt 90 ]; then
      step "bench_$kernel" timeout "$cap" python3 -m kiln bench llm "${COMMON[@]}" --decode-attention "$kernel" \
        --deadline-s $(( cap - 80 )) --out "$R/bench_$kernel"
      pack
    fi
  done
  python3 benchmarks/llm_rows.py "$R"
  pack
}

attention_kernels() {
  local -x TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
  pack() { tar czf "$OUT/kernels.tgz" -C "$R" .; }
  local C=(--model llama-3.2-3b --prompt-len 1024 --new-tokens 256 --prefill eager --repeats 3 --engines kiln-compiled
           --decode-attention triton)
  step attn_bench timeout 150 python3 benchmarks/decode_attention_bench.py --out "$R/attn_bench"
  pack
  step bench_triton timeout 300 python3 -m kiln bench llm "${C[@]}" --quant none,int4 --profile-decode 32 \
    --deadline-s 200 --out "$R/bench_triton"
  pack
  step bench_wide_tuning timeout $(( 570 - ($(date +%s) - start) )) python3 -m kiln bench llm "${C[@]}" --quant none \
    --inductor coordinate_descent_check_all_directions=true --inductor coordinate_descent_search_radius=2 \
    --deadline-s 60 --out "$R/bench_wide_tuning"
  python3 benchmarks/llm_rows.py "$R"
  pack
}

fused() {
  local -x TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
  pack() { tar czf "$OUT/decode.tgz" -C "$R" .; }
  step seed002 timeout 330 python3 -m kiln bench llm --preset seed002-llama3b --decode-matvec "${MATVEC:-triton}" \
    --profile-decode 32 --deadline-s 300 --out "$R/seed002"
  pack
  step quant timeout $(( 570 - ($(date +%s) - start) )) python3 -m kiln bench llm --model llama-3.2-3b \
    --prompt-len 1024 --new-tokens 256 --prefill eager --repeats 3 --engines kiln-compiled --decode-matvec inductor \
    --quant "${QUANT:-none,int4}" --profile-decode 32 --deadline-s 200 --out "$R/quant_inductor"
  python3 benchmarks/llm_rows.py "$R"
  pack
}

matvec() {
  local -x TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
  local m
  pack() { tar czf "$OUT/matvec.tgz" -C "$R" .; }
  if [ "${MICRO:-1}" = 1 ]; then
    step matvec timeout 240 python3 benchmarks/matvec_bench.py $([ "${INT4:-0}" = 1 ] && echo --int4) --out "$R/matvec"
    pack
  fi
  for m in ${MATVECS:-triton inductor}; do
    step "bench_$m" timeout $(( 580 - ($(date +%s) - start) )) python3 -m kiln bench llm --model llama-3.2-3b \
      --prompt-len 1024 --new-tokens 256 --prefill eager --repeats 3 --engines kiln-compiled --decode-attention triton \
      --decode-matvec "$m" --quant "${QUANT:-none}" --profile-decode 32 --deadline-s 400 --out "$R/bench_matvec_$m"
    pack
  done
  python3 benchmarks/llm_rows.py "$R" --glob 'bench_matvec_*/results.json'
  pack
}

int4() {
  local -x TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
  local runs i name left
  pack() { tar czf "$OUT/int4.tgz" -C "$R" .; }
  # CUDA_LAUNCH_BLOCKING: the first run died of an illegal address somewhere in the replays; name the kernel.
  [ -n "${SKIP_MATVEC:-}" ] || step int4_matvec env CUDA_LAUNCH_BLOCKING=1 timeout 180 python3 benchmarks/int4_matvec_bench.py --out "$R/int4_matvec"
  pack
  # RUNS=2: the bench in two processes, same call (int4@triton's autotuned settings are kept in
  # Triton's cache, so the later processes take the first one's).
  runs=${RUNS:-1}
  for i in $(seq 1 "$runs"); do
    name=bench_int4; [ "$runs" -gt 1 ] && name=bench_int4_$i
    left=$(( 575 - ($(date +%s) - start) ))
    step $name timeout $left python3 -m kiln bench llm --model llama-3.2-3b \
      --prompt-len 1024 --new-tokens 256 --prefill eager --repeats 3 --engines kiln-compiled --decode-attention triton \
      --decode-matvec "${MATVEC:-triton}" --quant "${QUANT:-none,int4@triton,int4}" --profile-decode 32 \
      --deadline-s $(( left / (runs - i + 1) - 40 )) --out "$R/$name"
    pack
  done
  python3 benchmarks/llm_rows.py "$R"
  pack
}

confirm() {
  pack() { tar czf "$OUT/confirm.tgz" -C "$R" .; }
  step attention_check timeout 150 python3 benchmarks/decode_attention_check.py --out "$R/attention_check"
  pack
  step seed002 timeout 230 python3 -m kiln bench llm --preset seed002-llama3b --engines hf-compiled,kiln-compiled \
    --deadline-s 200 --out "$R/seed002"
  pack
}

quant() {
  local MODE=${MODE:-h100}
  # kiln uses torchao's Python tensor subclasses only (int4 runs on torch's own tinygemm op); its C++
  # extensions (fp8/mx kernels, built for one CUDA) are not needed, so they are not even loaded.
  local -x TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
  python3 - <<'PY' | tee "$R/quant_libs.txt"
import importlib, logging
logging.disable(logging.WARNING)
for name in ("torch", "torchao", "bitsandbytes"):
    try:
        print(f"{name} {importlib.import_module(name).__version__}")
    except Exception as exc:
        print(f"{name}: not available ({type(exc).__name__}: {exc})")
PY
# QUANT / ENGINES / DEADLINE narrow a call (e.g. QUANT=none,int4,int4@inductor ENGINES=kiln-compiled);
# ATTN picks the decode attention kernel (matmul, flash, triton; default matmul).
local DRY COMMON=(--batch 1 --prompt-len 1024 --new-tokens 256 --prefill eager --deadline-s "${DEADLINE:-300}"
        --decode-attention "${ATTN:-matmul}")
case "$MODE" in
  h100)
    step bench_quant_llama3b python3 -m kiln bench llm --model llama-3.2-3b "${COMMON[@]}" \
      --engines "${ENGINES:-kiln-compiled,hf-compiled}" --quant "${QUANT:-none,int4,int8,int4@inductor,nf4}" \
      --out "$R/bench_quant_llama3b"
    ;;
  h200-8b)
    step bench_quant_llama8b python3 -m kiln bench llm --model llama-3.1-8b "${COMMON[@]}" \
      --engines "${ENGINES:-kiln-compiled}" --quant "${QUANT:-none,int4,int4@inductor,int8}" --out "$R/bench_quant_llama8b"
    ;;
  dry)
    # Both modes' flags on a tiny Llama config on CPU: int4 through torchao needs CUDA, so the dry
    # run takes `auto` (torchao where it serves, kiln's layers elsewhere).
    cat > "$R/tiny_config.json" <<'EOF'
{"model_type": "llama", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": true,
 "initializer_range": 0.1}
EOF
    seq 0 1500 | awk '{printf "%d ", ($1 * 37) % 512}' > "$R/ppl_ids.txt"
    DRY=(--device cpu --batch 1 --prompt-len 64 --new-tokens 16 --prefill eager --deadline-s 300
         --quant-backend auto --ppl-file "$R/ppl_ids.txt" --ppl-context 256)
    step dry_h100_mode python3 -m kiln bench llm --model "$R/tiny_config.json" "${DRY[@]}" \
      --engines kiln-compiled,hf-compiled --quant none,int4,int8,int4@inductor,nf4 --out "$R/dry_h100_mode"
    step dry_h200_mode python3 -m kiln bench llm --model "$R/tiny_config.json" "${DRY[@]}" \
      --engines kiln-compiled --quant none,int4,int4@inductor,int8 --out "$R/dry_h200_mode"
    ;;
  *) echo "llm.sh: unknown MODE=$MODE (h100, h200-8b, dry)" >&2; return 2 ;;
esac
# The issue's goal, read from the results: int4 decode >= 1.8x kiln bf16 on the 3B shape.
python3 - "$R" <<'EOF'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*/results.json")):
    rows = json.loads(path.read_text())["results"]
    print(f"--- {path.parent.name}")
    for r in rows:
        label = r["engine"] + ("" if r["quant"] == "none" else f"[{r['quant']}]")
        fig = lambda k, f: format(r[k], f) if r.get(k) is not None else "-"
        print(f"{label:28} {r['status']:13} decode {fig('decode_tok_s', '8.1f')} tok/s  "
              f"x{fig('decode_vs_unquantized', '.2f'):>5} vs unquantized  roofline {fig('roofline_frac', '.2f')}  "
              f"weights {r['weight_bytes'] / 1e9:.2f} GB  KL {fig('drift_kl', '.3g')}  warm-up {fig('warmup_s', '.0f')} s")
EOF
  tar czf "$OUT/results.tgz" -C "$R" .
}

for part in ${PART//,/ }; do
  start=$(date +%s)
  echo "=== part $part ($(date +%T))"
  case $part in
    seed002|smoke) seed002 "$part" ;;
    decode-profile) decode_profile ;;
    attention) attention ;;
    attention-kernels) attention_kernels ;;
    fused) fused ;;
    matvec) matvec ;;
    int4) int4 ;;
    confirm) confirm ;;
    quant) quant ;;
  esac
  echo "=== part $part done in $(( $(date +%s) - start )) s"
done
