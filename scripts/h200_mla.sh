#!/usr/bin/env bash
# MLA decode kernel evidence on an H200, in phases that fit the device's 10-minute calls:
#   tests:       build, cuda_attention_tests (MlaDecode.*: double-loop reference, page 1/16/64,
#                h_q 16/32/48/128, bf16/fp8, up to 32k keys, PAGODA_MLA_DECODE=0 A/B) and
#                cuda_backend_tests
#   sanitize:    compute-sanitizer memcheck and racecheck on MlaDecode.SanitizerSmall
#   conformance: pagoda conformance --backends cuda (full grid, then the long column at 32k)
#   bench:       pagoda kernels --backend cuda on the MLA shapes under each of VARIANTS (A/B)
#   ncu:         ncu --set full of one MLA decode launch (B128 h_q 128 L4096) per NCU_VARIANTS;
#                NCU_SHAPE="batch q_heads kv_len page kv_dtype" another shape, NCU_KERNELS a
#                kernel-name regex (default mla_decode; "mla_decode|merge" with NCU_COUNT=2 also
#                profiles the split-KV merge that follows it)
#   kernels:     pagoda_cuda_bench's GQA decode / prefill / extend / verify shapes (ours only)
#   peers:       FlashInfer 0.5.3 flashinfer.mla.BatchMLAPagedAttentionWrapper (fa3, auto) beside
#                ours (bench/cuda/peers.py --mla; needs .whl carried, else n/a); reads the bench
#                phase's /tmp/mla_ours.jsonl (same call, or a later call on the same warm machine)
# PHASES="..." selects (default: all, too long for one call); the build in $B (/tmp/b) is reused
# when present (REBUILD=1 forces it). Results: $OUT/mla.tgz (summary.txt, mla_h200.md, raw logs)
# and $OUT/summary.txt.
# COMMIT names the commit measured. carry: .debs (scripts/gpu_deps.sh fetch); for FlashInfer .whl.
set -uo pipefail
OUT=${OUT:-/tmp/pagoda_out}
R=/tmp/mla_results
rm -rf "$R"; mkdir -p "$R" "$OUT"
# The device tool returns at most 8 files: everything goes back as one archive plus the summary.
trap 'tar czf "$OUT/mla.tgz" -C "$R" .; cp "$R/summary.txt" "$OUT/" 2>/dev/null' EXIT
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
[ -d .debs ] && source scripts/gpu_deps.sh env
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1
B=${B:-/tmp/b}
T=$B/tests/cuda
PHASES=${PHASES:-"tests sanitize conformance bench kernels peers"}
S="$R/summary.txt"
echo "commit ${COMMIT:-unknown} phases '$PHASES' $(date -u +%FT%TZ)" | tee -a "$S"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
has() { case " $PHASES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if [ ! -x $B/pagoda ] || [ ! -x $T/cuda_attention_tests ] || [ "${REBUILD:-0}" = 1 ]; then
  t0=$(date +%s)
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DPAGODA_BUILD_BENCH=OFF > "$R/build.log" 2>&1 \
    || { tail -30 "$R/build.log"; exit 1; }
  ninja -C $B pagoda cuda_attention_tests cuda_backend_tests pagoda_cuda_bench >> "$R/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$R/build.log" | head -30; exit 1; }
  echo "build $(( $(date +%s) - t0 )) s" | tee -a "$S"
fi

if has tests; then
  echo "== cuda_attention_tests (MlaDecode.* and the rest) / cuda_backend_tests" | tee -a "$S"
  PAGODA_REQUIRE_GPU=1 timeout 300 $T/cuda_attention_tests ${TEST_FILTER:+--gtest_filter=$TEST_FILTER} \
    > "$R/attention_tests.log" 2>&1
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
  if [ "${LONG:-1}" = 1 ]; then  # LONG=0 skips the 32k column
    timeout 240 $B/pagoda conformance --backends cuda --long-kv 32768 > "$R/conformance_long32k.log" 2>&1
    echo "conformance long 32k rc=$?" | tee -a "$S"
    grep -E "^\| cuda " "$R/conformance_long32k.log" | tee -a "$S"
  fi
fi

if has bench; then
  # VARIANTS="name:VAR=v,VAR=v ..." — settings each shape is timed under, tagged "variant" in the
  # JSON (default: the platform's choice, then the mma.sync kernel; GENERIC=1 adds the generic
  # kernel, PAGODA_MLA_DECODE=0, at 5 iterations).
  VARIANTS=${VARIANTS:-"default: mma_sync:PAGODA_MLA_SM90=0"}
  echo "== pagoda kernels (MLA decode shapes; variants: $VARIANTS)" | tee -a "$S"
  J=/tmp/mla_ours.jsonl
  : > "$J"
  # batch h_q kv_len page latent
  # SHAPES overrides the list ("B h_q L page latent;..." ).
  IFS=';' read -r -a shapes <<< "${SHAPES:-64 16 4096 64 bf16;64 16 4096 64 fp8_e4m3;64 16 4096 1 bf16;64 16 4096 16 bf16;1 128 8192 64 bf16;8 128 8192 64 bf16;1 128 32768 64 bf16;8 128 32768 64 bf16;8 128 8192 64 fp8_e4m3;128 128 4096 64 bf16;64 128 4096 1 bf16}"
  for shape in "${shapes[@]}"; do
    set -- $shape
    args=(kernels --backend cuda --op decode --batch "$1" --q-heads "$2" --kv-len "$3" --page-size "$4"
          --kv-dtype "$5" --kv-heads 1 --head-dim 576 --head-dim-v 512 --json)
    for v in $VARIANTS ${GENERIC:+generic:PAGODA_MLA_DECODE=0}; do
      name=${v%%:*} spec=${v#*:}
      iters=(--iters 30)
      [ "$name" = generic ] && iters=(--iters 5 --warmup 1)
      envs=()
      [ -n "$spec" ] && IFS=',' read -r -a envs <<< "$spec"
      env "${envs[@]}" timeout 120 $B/pagoda "${args[@]}" "${iters[@]}" 2>> "$R/kernels.err" |
        sed "s/^{/{\"variant\": \"$name\", /" >> "$J" || echo "kernels $name $shape failed" | tee -a "$S"
    done
  done
  cp "$J" "$R/mla_ours.jsonl"
  python3 - "$J" << 'PYEOF' | tee -a "$S"
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"B{r['batch']} hq{r['q_heads']} L{r['kv_len']} p{r['page_size']} {r['kv_dtype']} "
              f"{r.get('variant')} {r.get('path')}: {r['ms']:.4f} ms {r['gbps']:.0f} GB/s "
              f"({r['pct_of_copy']:.0f}% of copy {r['copy_gbps']:.0f}) {r['tflops']:.1f} TFLOP/s "
              f"chunk {r.get('chunk_tokens')} items {r.get('work_items')}")
PYEOF
fi

if has kernels; then
  # The GQA decode / prefill / extend / verify shapes of bench/cuda/bench_cuda.cpp (ours only;
  # scripts/h200_final.sh STAGE=4 adds their peers).
  echo "== pagoda_cuda_bench (GQA kernels)" | tee -a "$S"
  timeout 120 $T/pagoda_cuda_bench "$R/kernels.jsonl" > "$R/kernels_bench.log" 2>&1
  echo "pagoda_cuda_bench rc=$?" | tee -a "$S"
  cut -c1-120 "$R/kernels.jsonl" | tee -a "$S"
fi

if has ncu; then
  # One launch of the MLA decode kernel (NCU_SHAPE, default B128 h_q 128 L4096 page 64 bf16) under
  # each of NCU_VARIANTS ("name:VAR=v,..."), ncu's full set (warp stall reasons, pipe utilisation)
  # without clock control; NCU_KERNELS / NCU_COUNT pick the kernels (the merge too, for split KV).
  NCUBIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  read -r nb nh nl np nd <<< "${NCU_SHAPE:-128 128 4096 64 bf16}"
  for v in ${NCU_VARIANTS:-"default:"}; do
    name=${v%%:*} spec=${v#*:}
    envs=()
    [ -n "$spec" ] && IFS=',' read -r -a envs <<< "$spec"
    env "${envs[@]}" timeout 180 "$NCUBIN" --clock-control none -k "regex:${NCU_KERNELS:-mla_decode}" -s 1 \
      -c "${NCU_COUNT:-1}" --set full --import-source no -f -o "$R/ncu_$name" \
      $B/pagoda kernels --backend cuda --op decode --batch "$nb" --q-heads "$nh" --kv-len "$nl" \
      --page-size "$np" --kv-dtype "$nd" --kv-heads 1 --head-dim 576 --head-dim-v 512 --iters 2 --warmup 1 \
      > "$R/ncu_$name.log" 2>&1
    echo "ncu $name rc=$?" | tee -a "$S"
    # The details page (throughputs, stall reasons) and the per-SASS-instruction samples, which
    # tools/ncu_stalls.py summarises (where the warps wait, and on what).
    "$NCUBIN" -i "$R/ncu_$name.ncu-rep" --page details > "$R/ncu_$name.txt" 2>&1
    "$NCUBIN" -i "$R/ncu_$name.ncu-rep" --page source --csv --print-source sass \
      > "$R/ncu_$name.sass.csv" 2> "$R/ncu_$name.sass.err"
    python3 tools/ncu_stalls.py "$R/ncu_$name.sass.csv" 40 > "$R/ncu_$name.stalls.txt" 2>&1
    head -60 "$R/ncu_$name.stalls.txt" | tee -a "$S"
    gzip -f "$R/ncu_$name.sass.csv"
    grep -E "^  [a-z_]+.*mla_decode|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Executed Ipc A|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|Stall [A-Z]|Tensor|Shared Memory" \
      "$R/ncu_$name.txt" | head -40 | tee -a "$S"
  done
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
