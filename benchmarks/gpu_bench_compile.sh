#!/bin/bash
# GPU evidence for `kiln bench compile` (run on the device machine from the repo root), one
# preset per call so each stays within one device command:
#   bash benchmarks/gpu_bench_compile.sh seed001-vit --steps 30
#   TAG=seed000-levels bash benchmarks/gpu_bench_compile.sh seed000-levels --steps 50 \
#     --modes default,reduce-overhead,max-autotune-no-cudagraphs
# Writes $OUT/r/$TAG/results.{json,md,png} and the log, and packs $OUT/r as $OUT/results.tgz.
set -uo pipefail
preset=${1:?usage: gpu_bench_compile.sh PRESET [kiln bench compile args...]}
shift
TAG=${TAG:-$preset}
source benchmarks/gpu_env.sh
echo "=== kiln bench compile --preset $preset $* ($(date +%T))"
python3 -m kiln bench compile --preset "$preset" --out "$R/$TAG" "$@" 2>&1 | tee "$R/$TAG.log" | grep -v '^W'
echo "=== done ($(date +%T))"
tar czf "$OUT/results.tgz" -C "$R" .
