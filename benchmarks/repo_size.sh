#!/bin/bash
# Repository size at two commits (issue 34's tidy: before and after), on any machine with git, from
# the repo root:
#   bash benchmarks/repo_size.sh BEFORE AFTER > benchmarks/results/repo_size/results.json
# Per commit: tracked bytes of benchmarks/ and of the whole tree (`git ls-tree -r -l`), the pack of
# that commit's tree alone (what a checkout or a `--depth 1` clone fetches) and the pack of its whole
# history (what a full clone fetches): `git rev-list --objects [-1] REV | git pack-objects --stdout`,
# with deltas and objects recompressed (--no-reuse-delta --no-reuse-object) so the figure does not
# depend on how this clone happens to be packed. Seconds on a CPU.
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: bash benchmarks/repo_size.sh BEFORE AFTER" >&2; exit 2; }
tracked() { git ls-tree -r -l "$1" -- ${2:+"$2"} | awk '{s += $4} END {print s + 0}'; }
pack() {  # pack size of REV's objects: with -1 its tree alone, without it the history too
  git rev-list --objects "$@" | git pack-objects --threads=1 --no-reuse-delta --no-reuse-object -q --stdout | wc -c
}
row() {
  printf '    {"commit": "%s", "benchmarks_tracked_bytes": %s, "tree_tracked_bytes": %s, "tree_pack_bytes": %s, "history_pack_bytes": %s}' \
    "$(git rev-parse --short "$1")" "$(tracked "$1" benchmarks)" "$(tracked "$1")" "$(pack -1 "$1")" "$(pack "$1")"
}
printf '{\n  "command": "bash benchmarks/repo_size.sh %s %s",\n  "env": {"git": "%s"},\n  "results": [\n' \
  "$1" "$2" "$(git --version | awk '{print $3}')"
row "$1"; printf ',\n'; row "$2"; printf '\n  ]\n}\n'
