#!/bin/bash
# Next session: kiln.kernels.triton_rows.SWAP_X_ONCE and SWAP_SCALES_AHEAD in one tree, int4@triton batch 16 and 32,
# processes off / x / both / off / x / both on shared caches; then decide the defaults and A/B them against their parent.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null || cp .b53/commit.txt "$R/commit.txt"
export TRITON_CACHE_DIR=/tmp/c/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c/inductor
left() { echo $(( 550 - ($(date +%s) - start) )); }
BENCH=(bench llm --model llama-3.2-3b --prompt-len 512 --new-tokens 128 --tuning decode --prefill eager --repeats 5
       --engines kiln-compiled --batch 16,32 --quant int4@triton)
one() {  # NAME SETTING
  local name=$1; shift
  if [ "$(left)" -lt 60 ]; then echo "=== skip $name: $(left) s left"; return; fi
  step "$name" timeout $(( $(left) - 10 )) python3 benchmarks/with_settings.py "$@" -- "${BENCH[@]}" --out "$R/$name"
}
one off1 kiln.kernels.triton_rows.SWAP_X_ONCE=False
one x1 kiln.kernels.triton_rows.SWAP_X_ONCE=True
one both1 kiln.kernels.triton_rows.SWAP_X_ONCE=True kiln.kernels.triton_rows.SWAP_SCALES_AHEAD=True
one x8w kiln.kernels.triton_rows.SWAP_X_ONCE=True kiln.kernels.triton_rows.DECODE_WARPS=8
one off2 kiln.kernels.triton_rows.SWAP_X_ONCE=False
one x2 kiln.kernels.triton_rows.SWAP_X_ONCE=True
one both2 kiln.kernels.triton_rows.SWAP_X_ONCE=True kiln.kernels.triton_rows.SWAP_SCALES_AHEAD=True
python3 - "$R" <<'PY'
import json, sys, pathlib
for t in ("off1", "x1", "both1", "x8w", "off2", "x2", "both2"):
    p = pathlib.Path(sys.argv[1]) / t / "results.json"
    if p.exists():
        d = json.loads(p.read_text())
        print(t, [(r["batch"], round(r["decode_step_ms"], 4)) for r in d["results"]])
PY
find "$R" -name "*.png" -delete
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
