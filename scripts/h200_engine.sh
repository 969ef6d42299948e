#!/usr/bin/env bash
# One device call for the engine's CUDA path (issue #5): the GPU engine test (CUDA engine vs the
# CPU reference engine, graphs on/off, replay == eager), scripts/hf_check.sh with --backend cuda
# (CUDA graphs on, the default), and `pagoda bench --backend cuda` with --cuda-graph on and off.
# Binaries: $PAGODA_ENGINE_BIN (default .engine_bin: `pagoda` + `cuda_engine_tests` built for
# sm_90a elsewhere) when they start here, else a fresh build (90a) into build-h200e.
# Highway (for a CPU-SIMD-enabled build) is unpacked from third_party/debs when the system has none.
# Outputs land in $OUT (gpu.txt, engine_tests.log, hf_check.log, bench_on.json, bench_off.json).
set -uo pipefail
OUT=${OUT:-/tmp/pagoda_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
date -u +%Y-%m-%dT%H:%MZ >> "$OUT/gpu.txt"
if ! pkg-config --exists libhwy 2>/dev/null && compgen -G "third_party/debs/*.deb" >/dev/null; then
  for f in third_party/debs/*.deb; do dpkg -x "$f" /tmp/hwy; done
  pc=$(find /tmp/hwy -name libhwy.pc | head -1)
  sed -i "s|^prefix=.*|prefix=/tmp/hwy/usr|" "$pc"
  export PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$(dirname "$(dirname "$pc")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1
BIN=${PAGODA_ENGINE_BIN:-.engine_bin}
chmod +x "$BIN"/* 2>/dev/null
if ! "$BIN/pagoda" version > /dev/null 2>&1 || ! "$BIN/cuda_engine_tests" --gtest_list_tests > /dev/null 2>&1; then
  echo "== prebuilt binaries do not start here; building (90a)"
  B=build-h200e
  cmake -S . -B $B -G Ninja -DPAGODA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DPAGODA_BUILD_TESTS=OFF -DPAGODA_BUILD_BENCH=OFF -DPAGODA_CUDA_DEVICE_TESTS=ON \
    > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  ninja -C $B pagoda cuda_engine_tests >> "$OUT/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
  mkdir -p .engine_bin_dev && cp $B/pagoda $B/tests_cuda/cuda_engine_tests .engine_bin_dev/
  BIN=.engine_bin_dev
fi
echo "== GPU engine tests"
timeout 90 "$BIN/cuda_engine_tests" > "$OUT/engine_tests.log" 2>&1; echo "engine tests rc=$?"
grep -E "^\[  |max \||graph replay|Failure|Expected|Which" "$OUT/engine_tests.log" | head -40
echo "== hf_check --backend cuda (CUDA graphs on)"
BUILD=$PWD/$BIN PYTHONUNBUFFERED=1 timeout 100 scripts/hf_check.sh --backend cuda > "$OUT/hf_check.log" 2>&1
echo "hf_check rc=$?"; tail -25 "$OUT/hf_check.log"
for g in on off; do
  echo "== bench --backend cuda --cuda-graph $g"
  timeout 60 "$BIN/pagoda" bench --backend cuda --cuda-graph $g --json > "$OUT/bench_$g.json" \
    2> "$OUT/bench_$g.err"; echo "bench $g rc=$?"; cat "$OUT/bench_$g.json"; tail -3 "$OUT/bench_$g.err"
done
