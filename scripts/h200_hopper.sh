#!/usr/bin/env bash
# One device call for the Hopper prefill kernel (issue 10): build the CUDA tests and bench
# (sm_90a), check the SASS holds HGMMA, run the prefill/extend/verify GPU tests on the sm90 path,
# compute-sanitizer on two of them, and time our prefill shapes with the sm90 kernel and with the
# mma.sync kernel (PAGODA_SM90_PREFILL=0) side by side; PEERS=1 adds cuDNN/flash SDPA
# (peers.py) and FLASHINFER=1 FlashInfer fa3/fa2 (needs .whl carried). Logs: $OUT/hopper.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/pagoda_out}
R=/tmp/hopper_res
rm -rf "$R"; mkdir -p "$R" "$OUT"
trap 'tar czf "$OUT/hopper.tgz" -C "$R" .' EXIT
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
[ -d .debs ] && source scripts/gpu_deps.sh env
git log -1 --format=%h > "$R/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$R/gpu.txt"
B=${B:-/tmp/b-hop}
cmake -S . -B $B -G Ninja -DPAGODA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DPAGODA_BUILD_TESTS=OFF -DPAGODA_BUILD_BENCH=OFF -DPAGODA_CUDA_DEVICE_TESTS=ON \
  > "$R/build.log" 2>&1 || { tail -30 "$R/build.log"; exit 1; }
ninja -C $B cuda_attention_tests pagoda_cuda_bench >> "$R/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$R/build.log" | head -30; exit 1; }
obj=$(find $B -name 'prefill_sm90.cu.o' | head -1)
echo "HGMMA in sm90 prefill SASS: $(cuobjdump --dump-sass "$obj" 2>/dev/null | grep -c HGMMA)"
T=$B/tests_cuda/cuda_attention_tests
FILTER=${FILTER:-'CudaExtend.*:CudaGraph.*:CudaPlan.*'}
echo "== tests (sm90 prefill)"
timeout 60 $T --gtest_filter="$FILTER" > "$R/tests_sm90.log" 2>&1; echo "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which|actual|max" "$R/tests_sm90.log" | head -30
if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck synccheck; do
    timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $T \
      --gtest_filter='CudaExtend.CausalWithPrefix:CudaExtend.TreeMaskVerify' > "$R/san_$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY' "$R/san_$tool.log" | tail -1)"
  done
fi
echo "== bench: sm90 vs mma.sync"
BF=${BENCH_FILTER:-}
for rep in 1 2; do
  timeout 40 $B/tests_cuda/pagoda_cuda_bench "$R/sm90_$rep.jsonl" "$BF" > /dev/null
  PAGODA_SM90_PREFILL=0 timeout 40 $B/tests_cuda/pagoda_cuda_bench "$R/mma_$rep.jsonl" "$BF" > /dev/null
done
python3 - "$R" <<'PY'
import json, sys, glob
r = sys.argv[1]
def load(p):
    return {j["case"]: j for j in (json.loads(l) for l in open(p) if l.strip())}
sm = [load(f"{r}/sm90_{i}.jsonl") for i in (1, 2)]
mm = [load(f"{r}/mma_{i}.jsonl") for i in (1, 2)]
for c in sm[0]:
    if not any(k in c for k in ("prefill", "extend", "tree")):
        continue
    a = min(s[c]["ms"] for s in sm if c in s)
    b = min(s[c]["ms"] for s in mm if c in s)
    f = sm[0][c]["flops"]
    print(f"{c:36s} sm90 {a:8.3f} ms {f/a/1e9:6.0f} TF/s | mma.sync {b:8.3f} ms {f/b/1e9:6.0f} TF/s | x{b/a:.2f}")
PY
if [ "${PEERS:-0}" = 1 ]; then
  PYTHONUNBUFFERED=1 PAGODA_FLEX=0 timeout 200 python3 bench/cuda/peers.py "$R/sm90_1.jsonl" "$R/peers.md" "$R/gpu.txt" > "$R/peers.log" 2>&1
  tail -20 "$R/peers.md"
fi
if [ "${FLASHINFER:-0}" = 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$R/pip.log" 2>&1
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 300 python3 bench/cuda/flashinfer_peer.py "$R/flashinfer.jsonl" "${FI_FILTER:-}" > "$R/flashinfer.log" 2>&1
  echo "flashinfer rc=$?"; cat "$R/flashinfer.jsonl"
fi
