#!/usr/bin/env bash
# Same-call A/B of prepared patches, set up on the device itself, so the working tree here stays
# at the head: a copy of the tree becomes the base (var_base: src tests bench/cuda cmake
# CMakeLists.txt CMakePresets.json tools scripts), the patches are applied in order to the
# device's working tree (PATCHES="a.patch b.patch", paths from the repo root; git apply, else
# patch -p1), and scripts/h200_mla_prefill.sh STAGE=A builds both and compares them, the patched
# tree as "main" (its settings pass through: COMMIT, ROUNDS, EXTRA, CONFORMANCE, MEMCHECK,
# RACECHECK, SYNCCHECK, SANITIZE_FIRST, AB_FILTERS). A patch that does not apply stops the call
# before any build. Example
# (bench/results/sm90_unit_lists_prep_5265e93/README.md):
#   PATCHES="bench/results/sm90_mla192_prep_bfee805/mla192_k64_overlap.patch
#            bench/results/sm90_unit_lists_prep_5265e93/unit_lists.patch" COMMIT=<head>+patches
#   ROUNDS=3 CONFORMANCE=1 EXTRA="..." bash scripts/h200_patch_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
: "${PATCHES:?PATCHES names the patch files}"
rm -rf var_base && mkdir -p var_base/bench
cp -a src tests cmake CMakeLists.txt CMakePresets.json tools scripts var_base/ || exit 1
cp -a bench/cuda var_base/bench/ || exit 1
for p in $PATCHES; do
  if command -v git > /dev/null; then
    git apply "$p" || { echo "patch $p does not apply"; exit 1; }
  else
    patch -p1 --forward < "$p" || { echo "patch $p does not apply"; exit 1; }
  fi
  echo "applied $p"
done
exec env STAGE=A BASE=var_base bash scripts/h200_mla_prefill.sh
