#!/usr/bin/env bash
# One device call: this tree against other trees on the same machine, for the prefill kernels
# (different calls may land on different H200s, whose prefill times differ by several percent,
# so only a same-call A/B can show a change of that size).
#   TREES="name:dir ..." — the other trees, each a directory in this checkout left untracked so
#     the device copy carries it (scripts/make_prefill_variants.sh makes them: an older commit,
#     or this tree with a patch from bench/results/hopper_h200/ applied).
#   VARIANT_ENV — also time this tree under it (default PAGODA_SM90_PINGPONG=1).
# Superseded by h200_sm90_ab.sh (which also times extend / verify / MLA decode); kept as the
# generator of the 2026-12-01 results in hopper_h200.md.
# Builds every tree (sm_90a, in parallel), runs this tree's cuda_attention_tests and the other
# trees' prefill / extend / verify ones (CudaExtend.*; PAGODA_REQUIRE_GPU=1), then
# pagoda_cuda_bench's prefill cases twice, interleaved over the trees, plus mma.sync
# (PAGODA_SM90_PREFILL=0) at B4 S4096 for this tree and the first other.
# Everything lands in $OUT/prefill_ab.tgz (one file: the result folder caps the file count);
# the times go to stdout. COMMIT names this tree's commit.
set -uo pipefail
OUT=${OUT:-/tmp/pagoda_out}
R=/tmp/prefill_ab
rm -rf "$R"; mkdir -p "$R" "$OUT"
trap 'tar czf "$OUT/prefill_ab.tgz" -C "$R" .' EXIT
cd "$(dirname "$0")/.." || exit 1
TREES=${TREES:?TREES=\"name:dir ...\"}
VARIANT_ENV=${VARIANT_ENV:-PAGODA_SM90_PINGPONG=1}
# shellcheck disable=SC1091
[ -d .debs ] && source scripts/gpu_deps.sh env
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  echo "commit ${COMMIT:-unknown}; trees: main:. $TREES; variant $VARIANT_ENV; $(date -u +%FT%TZ)"
} | tee "$R/gpu.txt"
# shellcheck disable=SC1091
source scripts/device_lib.sh  # device_build_tree
names=(main)
device_build_tree main . 4 pagoda_cuda_bench cuda_attention_tests &
for t in $TREES; do
  names+=("${t%%:*}")
  device_build_tree "${t%%:*}" "${t#*:}" 4 pagoda_cuda_bench cuda_attention_tests &
done
wait
PAGODA_REQUIRE_GPU=1 timeout 120 /tmp/b-main/tests/cuda/cuda_attention_tests > "$R/tests.log" 2>&1
echo "main tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$R/tests.log" | tr '\n' ' ')"
for n in "${names[@]:1}"; do  # the prefill / extend / verify tests of every other tree
  t=/tmp/b-$n/tests/cuda/cuda_attention_tests
  [ -x "$t" ] || continue
  PAGODA_REQUIRE_GPU=1 timeout 60 "$t" --gtest_filter='CudaExtend.*' > "$R/tests_$n.log" 2>&1
  echo "$n tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$R/tests_$n.log" | tr '\n' ' ')"
done
for r in 1 2; do
  for n in "${names[@]}"; do
    [ -x "/tmp/b-$n/tests/cuda/pagoda_cuda_bench" ] || continue
    timeout 60 "/tmp/b-$n/tests/cuda/pagoda_cuda_bench" "$R/${n}_sm90_$r.jsonl" prefill > /dev/null
  done
  env "$VARIANT_ENV" timeout 60 /tmp/b-main/tests/cuda/pagoda_cuda_bench "$R/main_variant_$r.jsonl" prefill > /dev/null
  for n in main "${names[1]:-}"; do
    [ -n "$n" ] && [ -x "/tmp/b-$n/tests/cuda/pagoda_cuda_bench" ] || continue
    PAGODA_SM90_PREFILL=0 timeout 30 "/tmp/b-$n/tests/cuda/pagoda_cuda_bench" "$R/${n}_mma_$r.jsonl" prefill_causal_b4_s4096 > /dev/null
  done
done
for f in "$R"/*.jsonl; do
  python3 -c "
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l); print(sys.argv[1].split('/')[-1].ljust(24), j['case'][:30].ljust(30), j['ms'])
" "$f"
done | tee "$R/times.txt"
