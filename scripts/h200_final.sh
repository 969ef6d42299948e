#!/usr/bin/env bash
# The session's closing GPU evidence in two bounded device calls on one warm H200 (the build in
# /tmp/b-fin survives between them). Logs: $OUT/final<stage>.tgz.
#   STAGE=1: build every GPU target (sm_90a, tests on); the attention tests (and the sm90 path
#            under ping-pong), cuda conformance (CONFORMANCE=0 skips), the prefill kernels: sm90
#            (with and without PDL), sm90 ping-pong, mma.sync.
#   STAGE=2: bench/cuda/run_evidence_h200.sh (ctest -L gpu with PAGODA_REQUIRE_GPU=1, cuda
#            conformance incl. the long column, `pagoda kernels --backend cuda` with ceilings).
#   STAGE=3: cuDNN / flash SDPA peers of stage 1's shapes (peers.py); speculative decoding A/Bs on
#            the 1B layout (graphs vs eager, n-gram; SPEC=0 skips); FlashInfer fa3/fa2 when
#            FLASHINFER=1 (needs .whl carried).
#   STAGE=4: the prefill table in one call: cuda conformance (CONFORMANCE=0 skips),
#            pagoda_cuda_bench (PDL on and off, sm90 ping-pong off), an ncu profile (full set: warp
#            stall reasons, pipe utilisation, source hot spots) of one sm90 launch on B4 S4096,
#            peers.py (cuDNN / flash SDPA, ceilings) and FlashInfer (FI_BACKENDS, default fa3)
#            on FI_FILTER's shapes (comma-separated; needs .whl carried). AB=0 skips the PDL / ping-pong
#            A/B runs, PROFILE=0 the ncu profile; B names the build folder (default /tmp/b-fin).
# COMMIT names the commit measured (the device copy carries no reliable git metadata).
set -uo pipefail
STAGE=${STAGE:-1}
OUT=${OUT:-/tmp/pagoda_out}
R=/tmp/final$STAGE
rm -rf "$R"; mkdir -p "$R" "$OUT"
trap 'tar czf "$OUT/final$STAGE.tgz" -C "$R" .' EXIT
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
[ -d .debs ] && source scripts/gpu_deps.sh env
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1
echo "commit ${COMMIT:-unknown} stage $STAGE $(date -u +%FT%TZ)" | tee "$R/commit.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
B=${B:-/tmp/b-fin}
build() {
  t0=$(date +%s)
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DPAGODA_BUILD_BENCH=OFF > "$R/build.log" 2>&1 || { tail -30 "$R/build.log"; exit 1; }
  targets="pagoda pagoda_cuda_bench cuda_attention_tests cuda_backend_tests cuda_engine_tests
           cuda_spec_tests model_kernels_tests gemv_tests"
  ninja -C $B $targets >> "$R/build.log" 2>&1 || { grep -E "error|FAILED" "$R/build.log" | head -30; exit 1; }
  echo "build $(( $(date +%s) - t0 )) s"
}
# A machine gone cold between calls has lost /tmp/b-fin: build again.
if [ "$STAGE" = 4 ]; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DPAGODA_BUILD_BENCH=OFF > "$R/build.log" 2>&1 || { tail -30 "$R/build.log"; exit 1; }
  ninja -C $B pagoda_cuda_bench pagoda >> "$R/build.log" 2>&1 || { grep -E "error|FAILED" "$R/build.log" | head -30; exit 1; }
  if [ "${CONFORMANCE:-1}" = 1 ]; then
    timeout 100 $B/pagoda conformance --backends cuda > "$R/conformance.txt" 2>&1
    echo "conformance rc=$?"; grep -E "^  (cuda|mutant)" "$R/conformance.txt" | head -14
    timeout 150 $B/pagoda conformance --backends cuda --long-kv 32768 > "$R/conformance_long32k.txt" 2>&1
    echo "conformance long-kv 32768 rc=$?"; grep -E "^  cuda " "$R/conformance_long32k.txt"
  fi
  timeout 60 $B/tests/cuda/pagoda_cuda_bench "$R/ours.jsonl" > /dev/null
  if [ "${AB:-1}" = 1 ]; then  # AB=0 skips the PDL-off and ping-pong-off runs
    PAGODA_PDL=0 timeout 60 $B/tests/cuda/pagoda_cuda_bench "$R/ours_nopdl.jsonl" > /dev/null
    PAGODA_SM90_PINGPONG=0 timeout 40 $B/tests/cuda/pagoda_cuda_bench "$R/ours_nopingpong.jsonl" prefill > /dev/null
  fi
  cut -c1-100 "$R/ours.jsonl"
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  [ "${PROFILE:-1}" = 1 ] || NCU=""  # PROFILE=0 skips the ncu profile
  if [ -n "$NCU" ]; then  # one launch of the sm90 kernel on B4 S4096: where its time goes
    timeout 150 "$NCU" --clock-control none -k regex:prefill_sm90 -c 1 --set full \
      $B/tests/cuda/pagoda_cuda_bench /tmp/ncu_case.jsonl prefill_causal_b4_s4096 > "$R/ncu_b4_s4096.txt" 2>&1
    echo "ncu rc=$?"; grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|DRAM Throughput|Executed Ipc A|Warp Cycles Per Issued|No Eligible|Stall" "$R/ncu_b4_s4096.txt" | head -24
  fi
  PYTHONUNBUFFERED=1 PAGODA_FLEX=0 timeout 150 python3 bench/cuda/peers.py "$R/ours.jsonl" "$R/peers.md" "$R/gpu.txt" > "$R/peers.log" 2>&1
  echo "peers rc=$?"; grep -E "^\| (prefill|extend|tree|decode)" "$R/peers.md" | head -20
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$R/pip.log" 2>&1
    FI_BACKENDS=${FI_BACKENDS:-fa3} PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout ${FI_TIMEOUT:-240} \
      python3 bench/cuda/flashinfer_peer.py "$R/flashinfer.jsonl" "${FI_FILTER:-}" > "$R/flashinfer.log" 2>&1
    echo "flashinfer rc=$?"; cat "$R/flashinfer.jsonl"
  fi
  exit 0
fi
if [ "$STAGE" = 1 ] || [ ! -x $B/tests/cuda/cuda_attention_tests ]; then build; fi
if [ "$STAGE" = 2 ]; then
  if [ -x bench/cuda/run_evidence_h200.sh ]; then
    PAGODA_COMMIT=${COMMIT:-} timeout 330 bash bench/cuda/run_evidence_h200.sh $B "$R/evidence" > "$R/evidence.out" 2>&1
    echo "evidence rc=$?"; grep -E "rc=|passed|failed|Failed|FAIL|Timeout" "$R/evidence/summary.txt" | head -30
  else
    timeout 200 ctest --test-dir $B -L gpu -j3 --output-on-failure > "$R/ctest_gpu.log" 2>&1
    echo "ctest gpu rc=$?"; grep -E "tests passed|Failed|\*\*\*" "$R/ctest_gpu.log" | head
  fi
fi
if [ "$STAGE" = 1 ]; then
  echo "== GPU attention tests, then the sm90 path under ping-pong"
  PAGODA_REQUIRE_GPU=1 timeout 240 $B/tests/cuda/cuda_attention_tests > "$R/tests.log" 2>&1
  echo "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$R/tests.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|Expected|Which is|^seed" "$R/tests.log" | head -20
  PAGODA_REQUIRE_GPU=1 PAGODA_SM90_PINGPONG=1 timeout 120 $B/tests/cuda/cuda_attention_tests \
    --gtest_filter='CudaExtend.*:CudaGraph.*' > "$R/tests_pingpong.log" 2>&1
  echo "pingpong tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$R/tests_pingpong.log" | tr '\n' ' ')"
  if [ "${CONFORMANCE:-1}" = 1 ]; then
    timeout 300 $B/pagoda conformance --backends cuda > "$R/conformance.txt" 2>&1
    echo "conformance rc=$?"; tail -4 "$R/conformance.txt"
  fi
  echo "== prefill: sm90 (PDL on, then off), sm90 ping-pong, mma.sync"
  timeout 60 $B/tests/cuda/pagoda_cuda_bench "$R/sm90.jsonl" > /dev/null
  for c in prefill extend tree; do
    PAGODA_PDL=0 timeout 40 $B/tests/cuda/pagoda_cuda_bench "$R/nopdl_$c.jsonl" $c > /dev/null
    PAGODA_SM90_PINGPONG=1 timeout 40 $B/tests/cuda/pagoda_cuda_bench "$R/pingpong_$c.jsonl" $c > /dev/null
  done
  PAGODA_SM90_PREFILL=0 timeout 60 $B/tests/cuda/pagoda_cuda_bench "$R/mma.jsonl" prefill > /dev/null
  for f in sm90 nopdl_prefill nopdl_extend nopdl_tree pingpong_prefill pingpong_extend pingpong_tree mma; do
    grep -h -E "prefill|extend|tree" "$R/$f.jsonl" 2>/dev/null | sed "s/^/$f /" | cut -c1-110
  done
  cp "$R/sm90.jsonl" /tmp/sm90_ours.jsonl
fi
if [ "$STAGE" = 3 ]; then
  PYTHONUNBUFFERED=1 PAGODA_FLEX=0 timeout 150 python3 bench/cuda/peers.py /tmp/sm90_ours.jsonl "$R/peers.md" "$R/gpu.txt" > "$R/peers.log" 2>&1
  echo "peers rc=$?"; head -30 "$R/peers.md"
  if [ "${SPEC:-1}" = 1 ]; then
  CKPT=/tmp/llama-1b
  if [ ! -f $CKPT/config.json ]; then
    timeout 150 python3 tools/make_checkpoint.py --layout 1b --dtype bf16 --seed 0 --out $CKPT \
      > "$R/checkpoint.log" 2>&1 || { tail -5 "$R/checkpoint.log"; }
  fi
  P="$B/pagoda bench --model $CKPT --backend cuda --json"
  run() {  # name, args...
    local name=$1; shift
    timeout 90 $P "$@" > "$R/$name.json" 2> "$R/$name.err"; echo "== $name rc=$?"
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); s=j['spec']; print({k: j.get(k) for k in ('speedup','baseline_output_tokens_per_s','spec_output_tokens_per_s','identical_outputs','leaked_pages')}, {k: s.get(k) for k in ('mean_accept_length','rounds','verify_graph_steps','draft_graph_steps')})" "$R/$name.json" 2>/dev/null || tail -3 "$R/$name.err"
  }
  run self_draft --spec draft --spec-steps 3 --spec-topk 1 --spec-draft-tokens 4 \
      --workload random --requests 8 --input-len 256 --output-len 256 --max-running 1
  run self_draft_eager --spec draft --spec-steps 3 --spec-topk 1 --spec-draft-tokens 4 --spec-graph-tokens 0 \
      --workload random --requests 8 --input-len 256 --output-len 256 --max-running 1
  run ngram_random --spec ngram --spec-steps 4 --spec-topk 1 --spec-draft-tokens 4 \
      --workload random --requests 4 --input-len 512 --output-len 256 --max-running 1
  fi
  if [ "${FLASHINFER:-0}" = 1 ] && [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$R/pip.log" 2>&1
    PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout ${FI_TIMEOUT:-240} python3 bench/cuda/flashinfer_peer.py "$R/flashinfer.jsonl" "${FI_FILTER:-}" > "$R/flashinfer.log" 2>&1
    echo "flashinfer rc=$?"; cat "$R/flashinfer.jsonl"
  fi
fi
