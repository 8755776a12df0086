#!/bin/bash
# Call 4: the decode norm kernel (kiln.llm.decode_matvec.NORM_KERNEL) A/B, kiln bench llm batch 1,16,32, ABAB.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
cp .b52/commit.txt "$R/commit.txt"
export TRITON_CACHE_DIR=/tmp/c/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c/inductor
left() { echo $(( 560 - ($(date +%s) - start) )); }
run() {
  local name=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then echo "=== $name: skipped, $(left) s left"; return; fi
  step "$name" timeout -k 5 "$(( $(left) - 5 ))" "$@"
}
step check timeout 60 python3 .b52/norm_check.py
B=(bench llm --model llama-3.2-3b --prompt-len 512 --new-tokens 128 --tuning decode --prefill eager --repeats 5
   --engines kiln-compiled --batch 1,16,32 --quant none)
run base1 150 python3 benchmarks/with_settings.py kiln.llm.decode_matvec.NORM_KERNEL=False -- "${B[@]}" --out "$R/base1"
run new1 100 python3 benchmarks/with_settings.py kiln.llm.decode_matvec.NORM_KERNEL=True -- "${B[@]}" --out "$R/new1"
run base2 90 python3 benchmarks/with_settings.py kiln.llm.decode_matvec.NORM_KERNEL=False -- "${B[@]}" --out "$R/base2"
run new2 90 python3 benchmarks/with_settings.py kiln.llm.decode_matvec.NORM_KERNEL=True -- "${B[@]}" --out "$R/new2"
for t in base1 new1 base2 new2; do grep -h "kiln-compiled b" "$R/$t.log" | grep "│" ; done
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
