#!/bin/bash
# Call 2: int4@triton batch 16, where its attention is launched early: module settings switched in one tree.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
cp .b53/commit.txt "$R/commit.txt"
export TRITON_CACHE_DIR=/tmp/c/triton TORCHINDUCTOR_CACHE_DIR=/tmp/c/inductor
left() { echo $(( 530 - ($(date +%s) - start) )); }
BENCH=(bench llm --model llama-3.2-3b --prompt-len 512 --new-tokens 128 --tuning decode --prefill eager --repeats 5
       --engines kiln-compiled --batch 16 --quant int4@triton)
one() {  # NAME SETTING...
  local name=$1; shift
  if [ "$(left)" -lt 60 ]; then echo "=== skip $name: $(left) s left"; return; fi
  step "$name" timeout $(( $(left) - 10 )) python3 benchmarks/with_settings.py "$@" -- "${BENCH[@]}" --out "$R/$name"
}
one a0 kiln.kernels.triton_rows.PDL=True
one b1 kiln.kernels.triton_decode.PDL_ONE_CHUNK=False
one c1 kiln.kernels.triton_decode.ONE_CHUNK_FROM=256
one d1 kiln.kernels.triton_rows.PDL=False
one e1 kiln.kernels.triton_rows.LATE_TRIGGER=True
one a1 kiln.kernels.triton_rows.PDL=True
one b2 kiln.kernels.triton_decode.PDL_ONE_CHUNK=False
one c2 kiln.kernels.triton_decode.ONE_CHUNK_FROM=256
python3 - "$R" <<'PY'
import json, sys, pathlib
for d in sorted(pathlib.Path(sys.argv[1]).iterdir(), key=lambda p: p.stat().st_mtime):
    f = d / "results.json"
    if f.exists():
        j = json.loads(f.read_text())
        print(d.name, j["env"].get("module_settings"), [(r["batch"], r["status"], r.get("decode_step_ms")) for r in j["results"]])
PY
find "$R" -name "*.png" -delete
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
