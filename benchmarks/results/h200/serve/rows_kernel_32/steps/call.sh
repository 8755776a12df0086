#!/bin/bash
# Call 2: the server's decode step (steps.py) under decode-attention and dense-row-kernel settings,
# one process per variant, interleaved; then kiln bench llm batch 1/16 base vs LOOP_BLOCK=128 if time allows.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
cp .b51/commit.txt "$R/commit.txt"
export TRITON_CACHE_DIR=/tmp/c/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c/inductor
left() { echo $(( 555 - ($(date +%s) - start) )); }
run() {
  local name=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then echo "=== $name: skipped, $(left) s left"; return; fi
  step "$name" timeout -k 5 "$(( $(left) - 5 ))" "$@"
}
D=kiln.kernels.triton_decode
S=kiln.kernels.triton_skinny
SK="$S.TAKEN={(16,3072,3072),(16,3072,8192),(16,128256,3072),(32,3072,3072),(32,128256,3072)} $(python3 - <<'PY'
from kiln.kernels.triton_skinny import SETTINGS
s = dict(SETTINGS); s[(32, 3072, 3072)] = (64, 128, 2, 4, 4); s[(32, 128256, 3072)] = (128, 64, 1, 4, 4)
print("kiln.kernels.triton_skinny.SETTINGS=" + repr(s).replace(" ", ""))
PY
)"
st() { local label=$1 need=$2; shift 2; run "$label" "$need" env KILN_SETTINGS="$*" python3 .b51/steps.py "$label" "$R/$label.json"; }
st base 60
st st4 40 "$D.LOOP_STAGES=4"
st b128 40 "$D.LOOP_BLOCK=128"
st sk32 40 "$SK"
st base2 40
st b128st4 40 "$D.LOOP_BLOCK=128 $D.LOOP_STAGES=4"
st st4b 40 "$D.LOOP_STAGES=4"
st b128b 40 "$D.LOOP_BLOCK=128"
st sk32b 40 "$SK"
grep -h "row starts" "$R"/*.log
LLM=(bench llm --model llama-3.2-3b --quant none --batch 1,16 --prompt-len 512 --new-tokens 128 --tuning decode
     --prefill eager --repeats 3 --engines kiln-compiled)
run llm_base 130 python3 -m kiln "${LLM[@]}" --out "$R/llm_base"
run llm_b128 130 python3 benchmarks/with_settings.py "$D.LOOP_BLOCK=128" -- "${LLM[@]}" --out "$R/llm_b128"
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
