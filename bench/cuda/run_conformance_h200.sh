#!/usr/bin/env bash
# One device call for the CUDA conformance proof (issue #4): the GPU tests (tests/cuda), the
# full conformance grid on the GPU (`pagoda conformance --backends cuda`) and compute-sanitizer
# memcheck over the quick grid. Uses binaries prebuilt (sm_90a) in $BIN (default build-conf,
# carried with build-conf/devlibs and third_party/debs) when they load there; otherwise builds the
# needed targets on the device. Results land in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/pagoda_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
mkdir -p /tmp/hwy
for f in third_party/debs/*.deb; do dpkg -x "$f" /tmp/hwy; done  # Highway (cpu backend in the CLI)
export LD_LIBRARY_PATH=/tmp/hwy/usr/lib/x86_64-linux-gnu:$PWD/build-conf/devlibs:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
BIN=${BIN:-build-conf}
P=$BIN/pagoda
T=$BIN/tests/cuda
if ! [ -x "$P" ] || ldd "$P" "$T/cuda_backend_tests" | grep -q "not found"; then
  echo "prebuilt binaries do not load here; building"
  B=build-h200c
  { cmake -S . -B $B -G Ninja -DPAGODA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DPAGODA_BUILD_TESTS=OFF -DPAGODA_BUILD_BENCH=OFF -DPAGODA_CUDA_DEVICE_TESTS=ON &&
    ninja -C $B pagoda cuda_backend_tests cuda_attention_tests; } > "$OUT/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
  P=$B/pagoda
  T=$B/tests_cuda
fi
echo "== GPU tests"
for t in cuda_attention_tests cuda_backend_tests; do
  [ -x "$T/$t" ] || { echo "$t not built"; continue; }
  timeout 120 "$T/$t" > "$OUT/$t.log" 2>&1
  echo "$t rc=$?"
  grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|^\[ graph|PASSED|Failure|Expected|Which|seed|first" "$OUT/$t.log" | head -40
done
echo "== conformance (full grid, cuda)"
timeout 150 "$P" conformance --backends cuda --output "$OUT/conformance_cuda.md" > "$OUT/conformance.log" 2>&1
echo "conformance rc=$?"
grep -E "^FAIL|runs on| in [0-9.]+ s" "$OUT/conformance.log" | head -30
grep -E "^\| (backend|cuda|mutant)" "$OUT/conformance.log"
echo "== conformance (full grid, cuda, long column at 32,768 keys)"
timeout 200 "$P" conformance --backends cuda --long-kv 32768 --output "$OUT/conformance_cuda_32k.md" \
  > "$OUT/conformance_32k.log" 2>&1
echo "conformance 32k rc=$?"
grep -E "^FAIL|runs on| in [0-9.]+ s" "$OUT/conformance_32k.log" | head -30
grep -E "^\| (backend|cuda)" "$OUT/conformance_32k.log"
echo "== compute-sanitizer memcheck (quick grid, cuda)"
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$P" conformance --backends cuda --quick \
  > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"
grep -E "ERROR SUMMARY|^FAIL| in [0-9.]+ s|Invalid|out of bounds" "$OUT/memcheck.log" | head -20
