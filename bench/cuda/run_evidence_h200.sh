#!/usr/bin/env bash
# GPU evidence in one bounded call (issue 9 item 2), for an H200 with a build the caller made:
#   1. `ctest -L gpu` with PAGODA_REQUIRE_GPU=1 (every GPU skip is a failure): the CUDA gtest
#      binaries and `pagoda conformance --backends cuda` on the full grid (long column at 4,096
#      and at 32,768 keys);
#   2. `pagoda kernels --backend cuda --json` on the README's decode / prefill / extend / verify
#      shapes, CUDA-event timed, each once warm and once with --flush-l2, with the same-run
#      copy-bandwidth and cuBLAS bf16 GEMM ceilings in every JSON line.
# Everything (raw logs, JSON, a summary with the commit) goes to OUT_DIR. Budget: < 4 min.
#
# Usage: bench/cuda/run_evidence_h200.sh BUILD_DIR [OUT_DIR]
#   BUILD_DIR: a PAGODA_CUDA=ON tree (tests ON) with `pagoda` and tests/cuda built, e.g.
#     source scripts/gpu_deps.sh env &&
#     cmake -S . -B /tmp/b-ev -G Ninja -DPAGODA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
#       -DPAGODA_BUILD_BENCH=OFF && ninja -C /tmp/b-ev pagoda cuda_attention_tests \
#       cuda_backend_tests cuda_engine_tests cuda_spec_tests model_kernels_tests gemv_tests
#   OUT_DIR: default $OUT (the device tool's folder) or ./evidence_out.
set -uo pipefail
BUILD=${1:?usage: run_evidence_h200.sh BUILD_DIR [OUT_DIR]}
OUT_DIR=${2:-${OUT:-evidence_out}}
BUILD=$(cd "$BUILD" && pwd) || exit 2
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
cd "$(dirname "$0")/../.."
# The H200 image lacks PCRE2 / ICU / SentencePiece: their runtime libraries come from .debs
# (scripts/gpu_deps.sh; carry .debs), as for the build.
[ -d .debs ] && source scripts/gpu_deps.sh env
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1
P=$BUILD/pagoda
[ -x "$P" ] || { echo "no pagoda binary in $BUILD"; exit 2; }
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start )) s"; }
rc_all=0

{
  # PAGODA_COMMIT names the commit when the tree was copied without .git.
  echo "commit: ${PAGODA_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}$(git diff --quiet HEAD 2>/dev/null || echo ' (tree differs from the commit, or no git)')"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  "$P" version 2>/dev/null | head -1
} | tee "$OUT_DIR/summary.txt"

echo "== 1. ctest -L gpu (PAGODA_REQUIRE_GPU=1) [$(elapsed)]" | tee -a "$OUT_DIR/summary.txt"
PAGODA_REQUIRE_GPU=1 timeout 170 ctest --test-dir "$BUILD" -L gpu -j3 --timeout 160 --no-tests=error \
  --output-on-failure --output-log "$OUT_DIR/ctest_gpu.log" > "$OUT_DIR/ctest_gpu.out" 2>&1
rc=$?
[ $rc -eq 0 ] || rc_all=1
grep -E "Test +#|tests passed|tests failed|Total Test time|\*\*\*|Failed|Timeout" "$OUT_DIR/ctest_gpu.out" \
  | tee -a "$OUT_DIR/summary.txt"
echo "ctest rc=$rc" | tee -a "$OUT_DIR/summary.txt"
# Every test's full output (passing ones too) is in ctest's LastTest.log: keep it, and put the
# conformance matrices in the summary.
cp "$BUILD/Testing/Temporary/LastTest.log" "$OUT_DIR/ctest_gpu_full.log" 2>/dev/null
grep -E "^\| (backend|cuda)|^FAIL|runs on| in [0-9.]+ s" "$OUT_DIR/ctest_gpu_full.log" | head -60 \
  >> "$OUT_DIR/summary.txt"

echo "== 2. pagoda kernels --backend cuda [$(elapsed)]" | tee -a "$OUT_DIR/summary.txt"
# name | op | batch | kv_len | q_len | page | kv dtype  (32 q / 8 kv heads, D 128, bf16 q/out)
shapes=(
  "decode_p16_b64_l4096 decode 64 4096 1 16 bf16"
  "decode_p1_b64_l4096 decode 64 4096 1 1 bf16"
  "decode_p16_b8_l32768 decode 8 32768 1 16 bf16"
  "decode_fp8_p16_b64_l4096 decode 64 4096 1 16 fp8_e4m3"
  "prefill_causal_b4_s4096 extend 4 4096 4096 16 bf16"
  "extend_q512_prefix8192_p16 extend 4 8704 512 16 bf16"
  "verify_tree64_prefix4096_b16 verify 16 4160 64 16 bf16"
)
: > "$OUT_DIR/kernels_cuda.jsonl"
for s in "${shapes[@]}"; do
  read -r name op b l q p kv <<< "$s"
  for flush in "" "--flush-l2"; do
    tag=$name${flush:+_flush}
    timeout 60 "$P" kernels --backend cuda --op "$op" --batch "$b" --kv-len "$l" --q-len "$q" \
      --q-heads 32 --kv-heads 8 --head-dim 128 --page-size "$p" --kv-dtype "$kv" --q-dtype bf16 \
      --iters 50 --warmup 5 $flush --json > "$OUT_DIR/kernels_$tag.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
      rc_all=1
      echo "$tag: rc=$rc $(tail -2 "$OUT_DIR/kernels_$tag.log" | tr '\n' ' ')" | tee -a "$OUT_DIR/summary.txt"
      continue
    fi
    line=$(tail -1 "$OUT_DIR/kernels_$tag.log")
    echo "{\"case\":\"$tag\",\"result\":$line}" >> "$OUT_DIR/kernels_cuda.jsonl"
    python3 - "$tag" "$line" <<'PY' | tee -a "$OUT_DIR/summary.txt"
import json, sys
j = json.loads(sys.argv[2])
print(f"{sys.argv[1]:36s} {j['ms']:.4f} ms  {j['gbps']:7.1f} GB/s = {j['pct_of_copy']:5.1f} % of "
      f"copy {j['copy_gbps']:.0f}  {j['tflops']:6.1f} TFLOP/s = {j['pct_of_gemm']:5.1f} % of "
      f"GEMM {j['gemm_tflops']:.0f}  ({j['timer']}, flush {j['flush_l2']})")
PY
  done
done
echo "== done in $(elapsed), rc=$rc_all" | tee -a "$OUT_DIR/summary.txt"
exit $rc_all
