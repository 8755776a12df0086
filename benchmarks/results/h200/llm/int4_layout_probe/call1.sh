#!/bin/bash
# Next session: benchmarks/int4_layout_probe.py (the int4 row kernel's loop with a word's nibbles R inputs apart)
# at 16 and 32 rows on the 3B projections; then a settings_sweep of anything it suggests.
set -u
start=$(date +%s)
source benchmarks/device_env.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null || true
step probe timeout 300 python3 benchmarks/int4_layout_probe.py --out "$R/probe" --rows 16,32 --repeats 15
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
echo "=== done in $(( $(date +%s) - start )) s"
