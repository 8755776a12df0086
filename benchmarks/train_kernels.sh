#!/bin/bash
# kiln's training kernels on the device machine, from the repo root: their CUDA tests, then
# benchmarks/train_kernels_probe.py (the SwiGLU and cross-entropy kernels alone against inductor's,
# at the Llama-3.2-1B step's shapes), then, when PART is set, benchmarks/train_llm.sh with the same
# environment in the seconds left of a CALL_S (default 570) s call (SKIP_TESTS=1 skips the tests):
#
#   PART=1b BATCH_1B=8 KILN_ROWS_1B=kiln-master-tce,kiln-master bash benchmarks/train_kernels.sh
#
# Writes $OUT/r/train_kernels_probe.json, $OUT/r/kernels_tests.log and what train_llm.sh writes.
set -uo pipefail
source benchmarks/device_env.sh
if [ -z "${SKIP_TESTS:-}" ]; then
  step kernels_tests timeout 180 python3 -m pytest -q -p no:cacheprovider tests/train/test_train_kernels_cuda.py \
    tests/train/test_master_adamw_cuda.py
fi
step kernels_probe timeout 150 python3 benchmarks/train_kernels_probe.py --tokens "${PROBE_TOKENS:-16384}" \
  --out "$R/train_kernels_probe.json"
if [ -n "${PART:-}" ]; then
  TOTAL_S=$(( ${CALL_S:-570} - ($(date +%s) - start) )) bash benchmarks/train_llm.sh
fi
