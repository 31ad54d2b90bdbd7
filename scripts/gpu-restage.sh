#!/usr/bin/env bash
# Re-split the vLLM staging parts that ../shared/tools/vllm-on-gpu/prepare.sh wrote under
# .gpu-stage/ so that each part fits in one device call beside this tree.
#   bash scripts/gpu-restage.sh        (after prepare.sh; prints the calls to make)
# PRISM_STAGE_BUDGET_MIB (56) is what a part and the tree may take together (its test uses less).
# A call carries the tracked files, the untracked ones git does not ignore and its carried
# paths, 64 MiB in all. prepare.sh cuts 60 MiB parts, and this tree's tracked files are ~4 MB
# (2026-12-06), so a part and the tree no longer fit ("the working tree is larger than 64 MiB").
# The parts are pieces of one tar stream joined in name order, so cutting it again at another
# size keeps what device-stage.sh does on the GPU machine.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
stage=$root/.gpu-stage
[ -f "$stage/part-00/device-stage.sh" ] || { echo "no $stage/part-00: run prepare.sh first" >&2; exit 1; }
tree=$(cd "$root" && git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
# 8 MiB below the limit: 60 MiB parts beside a 4.0 MB tree (63.9 MiB) were refused, 52 MiB
# parts passed (2026-12-06)
part=$(( (${PRISM_STAGE_BUDGET_MIB:-56} << 20) - tree ))
[ "$part" -gt $((8 << 20)) ] || { echo "the tree ($tree bytes) leaves no room for a part" >&2; exit 1; }
work=$(mktemp -d)
cp "$stage/part-00/device-stage.sh" "$work/"
cat "$stage"/part-*/stage.tar.* | split -b "$part" -d -a 2 - "$work/stage.tar."
rm -rf "$stage"
total=$(ls "$work"/stage.tar.* | wc -l)
n=0
for f in "$work"/stage.tar.*; do
  d=$(printf '%s/part-%02d' "$stage" $n)
  mkdir -p "$d"
  mv "$f" "$d/"
  cp "$work/device-stage.sh" "$d/"
  echo "$total" > "$d/parts"
  n=$((n + 1))
done
rm -rf "$work"
echo "re-split into $n parts of at most $((part >> 20)) MiB (tree: $((tree >> 10)) KiB); the calls:"
for ((i = 0; i < n; i++)); do
  printf '  run  carry=[".gpu-stage/part-%02d"]  command: bash .gpu-stage/part-%02d/device-stage.sh\n' $i $i
done
