#!/usr/bin/env bash
# MLA decode kernel evidence on an H200, in phases that fit the device's 10-minute calls:
#   tests:       build, cuda_attention_tests (MlaDecode.*: double-loop reference, page 1/16/64,
#                h_q 16/32/48/128, bf16/fp8, up to 32k keys, PAGODA_MLA_DECODE=0 A/B) and
#                cuda_backend_tests
#   sanitize:    compute-sanitizer memcheck and racecheck on MlaDecode.SanitizerSmall
#   conformance: pagoda conformance --backends cuda (full grid, then the long column at 32k)
#   bench:       pagoda kernels --backend cuda on the MLA shapes, new kernel and generic (A/B)
#   peers:       FlashInfer 0.5.3 flashinfer.mla.BatchMLAPagedAttentionWrapper (fa3, auto) beside
#                ours (bench/cuda/peers.py --mla; needs .whl carried, else n/a); reads the bench
#                phase's /tmp/mla_ours.jsonl (same call, or a later call on the same warm machine)
# PHASES="..." selects (default: all, too long for one call); the build in $B (/tmp/b) is reused
# when present (REBUILD=1 forces it). Results: $OUT/mla/ (summary.txt, mla_h200.md, raw logs).
# COMMIT names the commit measured. carry: .debs (scripts/gpu_deps.sh fetch); for FlashInfer .whl.
set -uo pipefail
OUT=${OUT:-/tmp/pagoda_out}
R="$OUT/mla"
mkdir -p "$R"
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
[ -d .debs ] && source scripts/gpu_deps.sh env
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1
B=${B:-/tmp/b}
T=$B/tests/cuda
PHASES=${PHASES:-"tests sanitize conformance bench peers"}
S="$R/summary.txt"
echo "commit ${COMMIT:-unknown} phases '$PHASES' $(date -u +%FT%TZ)" | tee -a "$S"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
has() { case " $PHASES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if [ ! -x $B/pagoda ] || [ ! -x $T/cuda_attention_tests ] || [ "${REBUILD:-0}" = 1 ]; then
  t0=$(date +%s)
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DPAGODA_BUILD_BENCH=OFF > "$R/build.log" 2>&1 \
    || { tail -30 "$R/build.log"; exit 1; }
  ninja -C $B pagoda cuda_attention_tests cuda_backend_tests >> "$R/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$R/build.log" | head -30; exit 1; }
  echo "build $(( $(date +%s) - t0 )) s" | tee -a "$S"
fi

if has tests; then
  echo "== cuda_attention_tests (MlaDecode.* and the rest) / cuda_backend_tests" | tee -a "$S"
  PAGODA_REQUIRE_GPU=1 timeout 300 $T/cuda_attention_tests > "$R/attention_tests.log" 2>&1
  echo "cuda_attention_tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$R/attention_tests.log" | tr '\n' ' ')" | tee -a "$S"
  grep -E "^\[       OK \] (MlaDecode|CudaGeneric)|^\[  FAILED|Failure|MLA decode test seed" \
    "$R/attention_tests.log" | head -40 | tee -a "$S"
  PAGODA_REQUIRE_GPU=1 timeout 150 $T/cuda_backend_tests > "$R/backend_tests.log" 2>&1
  echo "cuda_backend_tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$R/backend_tests.log" | tr '\n' ' ')" | tee -a "$S"
fi

if has sanitize && command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    PAGODA_REQUIRE_GPU=1 timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 \
      $T/cuda_attention_tests --gtest_filter='MlaDecode.SanitizerSmall' > "$R/$tool.log" 2>&1
    echo "compute-sanitizer $tool rc=$? $(tail -1 "$R/$tool.log")" | tee -a "$S"
  done
fi

if has conformance; then
  echo "== conformance --backends cuda" | tee -a "$S"
  timeout 240 $B/pagoda conformance --backends cuda > "$R/conformance.log" 2>&1
  echo "conformance rc=$?" | tee -a "$S"
  grep -E "^\| (backend|cuda) " "$R/conformance.log" | tee -a "$S"
  timeout 240 $B/pagoda conformance --backends cuda --long-kv 32768 > "$R/conformance_long32k.log" 2>&1
  echo "conformance long 32k rc=$?" | tee -a "$S"
  grep -E "^\| cuda " "$R/conformance_long32k.log" | tee -a "$S"
fi

if has bench; then
  echo "== pagoda kernels (MLA decode shapes; generic = PAGODA_MLA_DECODE=0)" | tee -a "$S"
  J=/tmp/mla_ours.jsonl
  : > "$J"
  # batch h_q kv_len page latent
  for shape in "64 16 4096 64 bf16" "64 16 4096 64 fp8_e4m3" "64 16 4096 1 bf16" "64 16 4096 16 bf16" \
               "1 128 8192 64 bf16" "8 128 8192 64 bf16" "1 128 32768 64 bf16" "8 128 32768 64 bf16" \
               "8 128 8192 64 fp8_e4m3" "128 128 4096 64 bf16"; do
    set -- $shape
    args=(kernels --backend cuda --op decode --batch "$1" --q-heads "$2" --kv-len "$3" --page-size "$4"
          --kv-dtype "$5" --kv-heads 1 --head-dim 576 --head-dim-v 512 --json)
    timeout 90 $B/pagoda "${args[@]}" --iters 30 >> "$J" 2>> "$R/kernels.err" \
      || echo "kernels $shape failed" | tee -a "$S"
    PAGODA_MLA_DECODE=0 timeout 120 $B/pagoda "${args[@]}" --iters 5 --warmup 1 >> "$J" 2>> "$R/kernels.err" \
      || echo "kernels generic $shape failed" | tee -a "$S"
  done
  cp "$J" "$R/mla_ours.jsonl"
  python3 - "$J" << 'PYEOF' | tee -a "$S"
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"B{r['batch']} hq{r['q_heads']} L{r['kv_len']} p{r['page_size']} {r['kv_dtype']} "
              f"{r.get('path')}: {r['ms']:.4f} ms {r['gbps']:.0f} GB/s ({r['pct_of_copy']:.0f}% of "
              f"copy {r['copy_gbps']:.0f}) {r['tflops']:.1f} TFLOP/s chunk {r.get('chunk_tokens')} "
              f"items {r.get('work_items')}")
PYEOF
fi

if has peers; then
  echo "== FlashInfer MLA peers" | tee -a "$S"
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl > "$R/pip.log" 2>&1
    export PYTHONPATH=/tmp/site
  fi
  PYTHONUNBUFFERED=1 timeout "${PEERS_TIMEOUT:-420}" python3 bench/cuda/peers.py --mla /tmp/mla_ours.jsonl \
    "$R/mla_h200.md" "$R/gpu.txt" > "$R/peers.log" 2>&1
  echo "peers rc=$?" | tee -a "$S"
  if [ -f "$R/mla_h200.md" ]; then tee -a "$S" < "$R/mla_h200.md"; else tail -20 "$R/peers.log"; fi
fi
