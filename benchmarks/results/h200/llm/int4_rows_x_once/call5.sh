#!/bin/bash
# Call 5: this tree, int4@triton batch 16 and 32, kiln.kernels.triton_rows.SWAP_DEQUANT off / on / off / on, one
# process each (benchmarks/with_settings.py) on shared caches; a process starts only with 45 s left of 215.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
cp .b54/commit.txt "$R/commit.txt"
export TRITON_CACHE_DIR=/tmp/c/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c/inductor
left() { echo $(( 215 - ($(date +%s) - start) )); }
COMMON=(--model llama-3.2-3b --prompt-len 512 --new-tokens 128 --tuning decode --prefill eager --repeats 5
        --engines kiln-compiled)
one() {  # NAME SETTING...
  local name=$1; shift
  if [ "$(left)" -lt 45 ]; then echo "=== skip $name: $(left) s left"; return; fi
  step "$name" timeout $(( $(left) - 3 )) python3 benchmarks/with_settings.py "$@" -- bench llm "${COMMON[@]}" \
    --batch 16,32 --quant int4@triton --out "$R/$name"
}
T=kiln.kernels.triton_rows
one off1 $T.SWAP_DEQUANT=False
one dq1 $T.SWAP_DEQUANT=True
one off2 $T.SWAP_DEQUANT=False
one dq2 $T.SWAP_DEQUANT=True
python3 - "$R" <<'PY'
import json, sys, pathlib
for t in ("off1", "dq1", "off2", "dq2"):
    p = pathlib.Path(sys.argv[1]) / t / "results.json"
    if p.exists():
        d = json.loads(p.read_text())
        print(t, [(r["batch"], round(r["decode_step_ms"], 4), r.get("fidelity_kl")) for r in d["results"]])
PY
find "$R" -name "*.png" -delete
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
