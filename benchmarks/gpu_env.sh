# Sourced by the benchmarks/gpu_*.sh scripts on the device machine (repo root, no network):
# $OUT/r is where results go ($R), wheels carried in .whl/ are installed aside, kiln runs from src/,
# and the GPU's name, driver and memory are recorded.
OUT=${OUT:-/tmp/kiln-out}
R=$OUT/r
mkdir -p "$R"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
# kiln's own dependencies the device image lacks travel as wheels: without tomli_w every `kiln train`
# (and so every bench scale point) fails before its first step (seen 2026-11-24). Say so at once.
if ! python3 -c "import tomli_w" 2>/dev/null; then
  echo "gpu_env.sh: tomli_w is missing: carry it in .whl/ (pip download --no-deps -d .whl tomli_w, run(carry=['.whl']))" >&2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.csv" 2>/dev/null
