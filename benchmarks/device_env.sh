# Sourced by the benchmark entry points (compile.sh, llm.sh, scale.sh, train.sh, health.sh, evidence.sh,
# train_llm.sh, llm_real_text.sh) on the device machine, from the repo root (no network there):
# $OUT/r is where results go ($R), wheels carried in .whl/ are installed aside, kiln runs from src/,
# the GPU's name, driver and memory are recorded in $R/nvidia-smi.csv, and `step NAME CMD...` runs a
# command with its full log kept in $R/NAME.log, shown without inductor's warning lines, with the
# seconds since `start`.
OUT=${OUT:-/tmp/kiln-out}
R=$OUT/r
mkdir -p "$R"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
# kiln's own dependencies the device image lacks travel as wheels: without tomli_w every `kiln train`
# (and so every bench scale point) fails before its first step. Say so at once.
if ! python3 -c "import tomli_w" 2>/dev/null; then
  echo "device_env.sh: tomli_w is missing: carry it in .whl/ (pip download --no-deps -d .whl tomli_w, run(carry=['.whl']))" >&2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.csv" 2>/dev/null
start=${start:-$(date +%s)}
step() {
  local name=$1; shift
  echo "=== $name: $* ($(date +%T))"
  "$@" 2>&1 | tee "$R/$name.log" | grep -v '^W[0-9]'
  echo "=== $name: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
}
