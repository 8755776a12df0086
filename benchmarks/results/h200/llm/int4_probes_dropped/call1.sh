#!/bin/bash
# Call 1: can int4 prefill's dequant overlap the matmuls on a side stream (probe)? And ncu of the int4 row kernel.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null || true
left() { echo $(( 400 - ($(date +%s) - start) )); }
step probe timeout 240 python3 .b52/overlap_probe.py 28
echo "=== left $(left) s"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
if [ -n "$NCU" ] && [ "$(left)" -gt 90 ]; then
  for rows in 16; do
    step ncu$rows timeout 120 "$NCU" --clock-control none --kernel-name regex:_int4_rows --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section SchedulerStats python3 .b52/rows_ncu.py $rows
  done
fi
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
