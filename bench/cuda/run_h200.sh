#!/usr/bin/env bash
# One device call: build pagoda's CUDA targets (sm_90a), run the GPU tests, compute-sanitizer on a
# quick subset, our benchmarks, the PyTorch peers and ceilings, and (if it builds) the
# conformance runner. Results land in $OUT (cuda_h200.md is commit-ready for bench/results/).
set -uo pipefail
OUT=${OUT:-/tmp/pagoda_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
B=build-h200
cmake -S . -B $B -G Ninja -DPAGODA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DPAGODA_BUILD_TESTS=OFF -DPAGODA_BUILD_BENCH=OFF -DPAGODA_CUDA_DEVICE_TESTS=ON \
  > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
time ninja -C $B cuda_attention_tests pagoda_cuda_bench >> "$OUT/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
echo "== tests"
timeout 300 ./$B/tests_cuda/cuda_attention_tests 2>&1 | tee "$OUT/tests.log" | grep -E "^\[  |FAIL|Failure|error|Expected|Which|path" | head -80
echo "== bench (ours)"
timeout 200 ./$B/tests_cuda/pagoda_cuda_bench "$OUT/ours.jsonl" && cat "$OUT/ours.jsonl"
echo "== peers"
PYTHONUNBUFFERED=1 timeout 300 python3 bench/cuda/peers.py "$OUT/ours.jsonl" "$OUT/cuda_h200.md" "$OUT/gpu.txt" > "$OUT/peers.log" 2>&1
tail -30 "$OUT/peers.log"
if [ "${PAGODA_SANITIZE_RUN:-1}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  echo "== compute-sanitizer memcheck (quick subset)"
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 ./$B/tests_cuda/cuda_attention_tests \
    --gtest_filter='CudaDecode.Bf16Page16Skewed:CudaExtend.CausalWithPrefix:CudaExtend.TreeMaskVerify:CudaGraph.*' \
    > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?"; tail -5 "$OUT/memcheck.log"
fi
if [ "${PAGODA_CONFORMANCE:-0}" = 1 ]; then
  echo "== conformance"
  (timeout 200 ninja -C $B pagoda > "$OUT/cli_build.log" 2>&1 && \
    timeout 120 ./$B/src/pagoda/cli/pagoda conformance --backends cuda --quick) > "$OUT/conformance.log" 2>&1
  echo "conformance rc=$?"; tail -30 "$OUT/conformance.log"
fi
