#!/usr/bin/env bash
# One device call: builds the GPU tests and `pagoda` for sm_90a in $BUILD_DIR (reused while the
# machine stays warm), runs the GPU tests named in $TESTS (default: attention, backend, model
# kernels, spec) with PAGODA_REQUIRE_GPU=1, the CUDA conformance grid (CONFORMANCE=0 skips it;
# LONG_KV=32768 adds the long run), then RUNS="..." of scripts/h200_spec.sh (empty: none).
# Everything lands in $OUT/check.tgz; a summary goes to stdout.
set -uo pipefail
# shellcheck disable=SC1091
source "$(dirname "$0")/device_lib.sh"
device_setup check
export PAGODA_REQUIRE_GPU=1
TESTS=${TESTS:-"cuda_attention_tests cuda_backend_tests model_kernels_tests cuda_spec_tests"}
# shellcheck disable=SC2086
device_build pagoda $TESTS ${EXTRA_TARGETS:-}
for t in $TESTS; do
  exe=$(find $B/tests -name "$t" -type f | head -1)
  timeout 240 "$exe" ${GTEST_ARGS:-} > "$R/$t.log" 2>&1
  echo "== $t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$R/$t.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|Expected|Which is|^seed" "$R/$t.log" | head -20
done
if [ "${CONFORMANCE:-1}" = 1 ]; then
  timeout 300 $B/pagoda conformance --backends cuda > "$R/conformance.txt" 2>&1
  echo "== conformance rc=$?"; tail -25 "$R/conformance.txt"
fi
if [ -n "${LONG_KV:-}" ]; then
  timeout 300 $B/pagoda conformance --backends cuda --long-kv "$LONG_KV" > "$R/conformance_long.txt" 2>&1
  echo "== conformance long-kv $LONG_KV rc=$?"; tail -6 "$R/conformance_long.txt"
fi
if [ -n "${RUNS:-}" ]; then
  OUT=$R bash scripts/h200_spec.sh | grep -v "^\[ " | cut -c1-1500
  mv $R/spec.tgz $R/spec_runs.tgz 2>/dev/null
fi
