#!/usr/bin/env bash
# Makes the trees scripts/h200_prefill_ab.sh compares, as untracked directories var_<name> at the
# repository root (remove them before committing; `git status` shows them):
#   var_f719c3b     — `git archive f719c3b`, the kernel the hopper_h200.md tables measured;
#   var_<patch>     — HEAD with bench/results/hopper_h200/<patch>.patch applied, for each patch
#                     named in $PATCHES (default: sm90_regsplit_40_232 sm90_nonblocking_producer
#                     sm90_overlap_variant).
# Prints the TREES= value to pass on.
set -euo pipefail
cd "$(dirname "$0")/.."
PATCHES=${PATCHES:-"sm90_regsplit_40_232 sm90_nonblocking_producer sm90_overlap_variant"}
rm -rf var_f719c3b && mkdir var_f719c3b && git archive f719c3b | tar -x -C var_f719c3b
rm -rf var_f719c3b/bench/results var_f719c3b/docs  # not needed to build; keeps the copy small
trees="f719c3b:var_f719c3b"
for p in $PATCHES; do
  d=var_$p
  rm -rf "$d" && mkdir "$d" && git archive HEAD | tar -x -C "$d"
  patch -s -p1 -d "$d" < "bench/results/hopper_h200/$p.patch"
  rm -rf "$d/bench/results" "$d/docs"
  trees="$trees $p:$d"
done
echo "TREES=\"$trees\""
