# Sourced by benchmarks/gpu_*.sh: `step NAME CMD...` runs a command, keeps its full log in
# $R/NAME.log and shows it without inductor's warning lines, with the seconds since `start`.
start=${start:-$(date +%s)}
step() {
  local name=$1; shift
  echo "=== $name: $* ($(date +%T))"
  "$@" 2>&1 | tee "$R/$name.log" | grep -v '^W[0-9]'
  echo "=== $name: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
}
