#!/usr/bin/env bash
# One device call: builds the GPU tests and `pagoda` for sm_90a in $BUILD_DIR (reused while the
# machine stays warm), runs the GPU tests named in $TESTS (default: attention, backend, model
# kernels, spec) with PAGODA_REQUIRE_GPU=1, the CUDA conformance grid (CONFORMANCE=0 skips it;
# LONG_KV=32768 adds the long run), then RUNS="..." of scripts/h200_spec.sh (empty: none).
# Everything lands in $OUT/check.tgz; a summary goes to stdout.
set -uo pipefail
OUT=${OUT:-/tmp/pagoda_out}
R=/tmp/check_results
rm -rf "$R"; mkdir -p "$R" "$OUT"
trap 'tar czf "$OUT/check.tgz" -C "$R" .' EXIT
cd "$(dirname "$0")/.."
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  date -u +%Y-%m-%dT%H:%MZ; echo "commit ${COMMIT:-unknown}"; } | tee "$R/gpu.txt"
if compgen -G ".debs/*.deb" > /dev/null; then
  # shellcheck disable=SC1091
  source scripts/gpu_deps.sh env
fi
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1 PAGODA_REQUIRE_GPU=1
B=${BUILD_DIR:-/tmp/b-spec}
export BUILD_DIR=$B
TESTS=${TESTS:-"cuda_attention_tests cuda_backend_tests model_kernels_tests cuda_spec_tests"}
if [ ! -f "$B/build.ninja" ]; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DPAGODA_BUILD_BENCH=OFF > "$R/build.log" 2>&1 \
    || { tail -40 "$R/build.log"; exit 1; }
fi
SECONDS=0
timeout 420 ninja -C $B pagoda $TESTS ${EXTRA_TARGETS:-} >> "$R/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$R/build.log" | head -40; exit 1; }
echo "build ${SECONDS}s"
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
