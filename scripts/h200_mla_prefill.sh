#!/usr/bin/env bash
# Evidence for the sm90 prefill kernel's DQK 192 / DV 128 instantiation (the non-absorbed MLA
# prefill) and its producer, in two device calls that each fit the 10-minute limit:
#   STAGE=A: builds this tree and, when BASE names an untracked directory holding an older tree
#            (`mkdir var_base && git archive <commit> | tar -x -C var_base`), that one too, in
#            parallel; runs this tree's cuda_attention_tests (PAGODA_REQUIRE_GPU=1), compute-
#            sanitizer memcheck on CudaExtend.MlaPrefillDims192x128, and pagoda_cuda_bench's
#            prefill / extend / verify / MLA-prefill cases twice, interleaved with the base tree's
#            (same call: a same-machine A/B), plus the MLA-prefill cases on the generic kernel
#            (PAGODA_SM90_PREFILL=0, the route before the 192 / 128 instantiation), and with
#            EXTRA="name:filter:VAR=v ..." this tree's bench cases matching filter under VAR=v,
#            ROUNDS times each (e.g. EXTRA="tbt:mla_:PAGODA_SM90_OVERLAP=0"); CONFORMANCE=1 adds
#            this tree's full conformance grid on cuda; MEMCHECK="gtest filter" replaces the
#            memcheck tests; RACECHECK="test:test..." adds a racecheck run of each (RACE_TIMEOUT s);
#            SYNCCHECK="gtest filter" a synccheck run; SANITIZE_FIRST=1 runs the sanitizers
#            before the whole test binary;
#            AB_FILTERS (default "prefill extend tree") names the bench filters of the A/B rounds.
#   STAGE=B: builds this tree when the machine lost it; with TESTS="gtest filter" those GPU tests
#            (PAGODA_REQUIRE_GPU=1); pagoda_cuda_bench; the cuDNN / flash / memory-efficient SDPA
#            peers with the machine's ceilings (bench/cuda/peers.py); `pagoda conformance
#            --backends cuda` (full grid; LONG=1, the default, adds the long column at 32k keys);
#            FlashInfer 0.5.3 fa3 (bench/cuda/flashinfer_peer.py, FI_FILTER's cases) when .whl is
#            carried and FLASHINFER is not 0, and with PEER_ROUNDS=n that many interleaved rounds
#            of ours and fa3 (bench/cuda/peer_rounds.py: per-round ratios, their median);
#            CONFORMANCE=0 skips both conformance runs. Call C
#            of 2026-12-02 (hopper_h200.md) ran
#            TESTS='CudaExtend.CausalWithPrefix:CudaExtend.TreeMaskVerify:CudaExtend.PrefillTiles*:
#            CudaExtend.MixedDecodeAndExtend:CudaGeneric.*:CudaGraph.*:CudaPlan.*' LONG=0
#            FLASHINFER=0 (then named STAGE=C).
# COMMIT names the commit measured. Results: $OUT/mla_prefill_<stage>.tgz and $OUT/summary_<stage>.txt.
set -uo pipefail
STAGE=${STAGE:-A}
OUT=${OUT:-/tmp/pagoda_out}
R=/tmp/mla_prefill_$STAGE
rm -rf "$R"; mkdir -p "$R" "$OUT"
trap 'tar czf "$OUT/mla_prefill_$STAGE.tgz" -C "$R" .; cp "$R/summary.txt" "$OUT/summary_$STAGE.txt" 2>/dev/null' EXIT
cd "$(dirname "$0")/.." || exit 1
# shellcheck disable=SC1091
source scripts/device_lib.sh  # device_deps, device_build_tree, device_sanitize (only functions)
device_deps "$R/summary.txt" || exit 1
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1
exec > >(tee -a "$R/summary.txt") 2>&1
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  echo "commit ${COMMIT:-unknown} stage $STAGE base ${BASE:-none} $(date -u +%FT%TZ)"; } | tee "$R/gpu.txt"
M=/tmp/b-main/tests/cuda
bench() {  # build name, output, filter[, env...]
  local n=$1 o=$2 f=$3; shift 3
  env "$@" timeout 90 "/tmp/b-$n/tests/cuda/pagoda_cuda_bench" "$R/$o.jsonl" "$f" > /dev/null ||
    echo "bench $n $o $f rc=$?"
}
times() {
  for f in "$R"/*.jsonl; do
    python3 - "$f" <<'EOF'
import json, sys
for l in open(sys.argv[1]):
    try:
        j = json.loads(l)
    except ValueError:
        continue
    if "ms" in j and "flops" in j:
        print(sys.argv[1].split('/')[-1].ljust(26), j['case'][:34].ljust(34), f"{j['ms']:.4f}",
              f"{j['flops'] / j['ms'] / 1e9:.0f} TFLOP/s", j.get('path', ''), j.get('chunk', ''))
EOF
  done | tee "$R/times.txt"
}

stamp() { echo "[${SECONDS} s] $*"; }  # seconds since the script started: where a call's time went

# STAGE A's sanitizers on this tree's tests: memcheck on MEMCHECK (one run); racecheck on each
# RACECHECK test in turn, each cut at RACE_TIMEOUT seconds (60 by default) so that one slow run
# costs neither the others nor the A/B much time; synccheck on SYNCCHECK when set.
sanitize() {
  local t=$M/cuda_attention_tests rt race_tests
  device_sanitize memcheck 150 "$R/memcheck.log" "$t" \
    --gtest_filter="${MEMCHECK:-CudaExtend.MlaPrefillDims192x128}" || return
  IFS=: read -r -a race_tests <<< "${RACECHECK:-}"
  for rt in "${race_tests[@]}"; do
    echo "$rt: $(device_sanitize racecheck "${RACE_TIMEOUT:-60}" "$R/racecheck_$rt.log" "$t" --gtest_filter="$rt")"
  done
  [ -z "${SYNCCHECK:-}" ] || device_sanitize synccheck 90 "$R/synccheck.log" "$t" --gtest_filter="$SYNCCHECK"
  stamp sanitized
}
run_tests() {  # [gtest filter]: this tree's cuda_attention_tests, all of them without one
  PAGODA_REQUIRE_GPU=1 timeout 200 $M/cuda_attention_tests ${1:+--gtest_filter="$1"} > "$R/tests.log" 2>&1
  echo "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$R/tests.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|Expected|Which is|seed|runs the" "$R/tests.log" | head -20
  stamp tested
}

if [ "$STAGE" = A ]; then
  # Wait on the builds by pid: a bare `wait` also waits for the tee above, which never ends.
  device_build_tree main . 12 pagoda pagoda_cuda_bench cuda_attention_tests &
  pids=$!
  if [ -n "${BASE:-}" ] && [ -d "$BASE" ]; then device_build_tree base "$BASE" 4 pagoda_cuda_bench & pids="$pids $!"; fi
  # shellcheck disable=SC2086
  wait $pids
  stamp built
  if [ "${SANITIZE_FIRST:-0}" = 1 ]; then sanitize; run_tests; else run_tests; sanitize; fi
  if [ "${CONFORMANCE:-0}" = 1 ]; then  # this tree on the full grid (mla-prefill column included)
    timeout 120 /tmp/b-main/pagoda conformance --backends cuda > "$R/conformance.txt" 2>&1
    echo "conformance rc=$?"; grep -E "^  (cuda|mutant)|^\| cuda " "$R/conformance.txt" | head -16
    stamp conformance
  fi
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for c in ${AB_FILTERS:-prefill extend tree}; do
      bench main "main_${c}_$r" "$c"
      [ -x /tmp/b-base/tests/cuda/pagoda_cuda_bench ] && bench base "base_${c}_$r" "$c"
    done
  done
  bench main main_mla_generic mla_ PAGODA_SM90_PREFILL=0
  bench main main_mla_plain mla_ PAGODA_SM90_PINGPONG=0
  # EXTRA="name:filter:VAR=v ..." — more runs of this tree's bench, each with one setting.
  for x in ${EXTRA:-}; do
    IFS=: read -r xn xf xe <<< "$x"
    for r in $(seq 1 "${ROUNDS:-2}"); do bench main "main_${xn}_$r" "$xf" "$xe"; done
  done
  stamp benched
  times
fi

if [ "$STAGE" = B ]; then
  if [ -n "${TESTS:-}" ]; then
    [ -x $M/cuda_attention_tests ] && [ -x /tmp/b-main/pagoda ] ||
      device_build_tree main . 16 pagoda pagoda_cuda_bench cuda_attention_tests
    run_tests "$TESTS"
  else
    [ -x $M/pagoda_cuda_bench ] && [ -x /tmp/b-main/pagoda ] || device_build_tree main . 16 pagoda pagoda_cuda_bench
  fi
  bench main ours ""
  times
  PYTHONUNBUFFERED=1 PAGODA_FLEX=0 timeout 170 python3 bench/cuda/peers.py "$R/ours.jsonl" "$R/peers.md" "$R/gpu.txt" > "$R/peers.log" 2>&1
  echo "peers rc=$?"; grep -E "^\| (prefill|extend|tree|decode|mla)|^- " "$R/peers.md" | cut -c1-230
  if [ "${CONFORMANCE:-1}" != 0 ]; then  # CONFORMANCE=0: the grid ran elsewhere in this session
    timeout 120 /tmp/b-main/pagoda conformance --backends cuda > "$R/conformance.txt" 2>&1
    echo "conformance rc=$?"; grep -E "^  (cuda|mutant)|mla-prefill" "$R/conformance.txt" | head -16
  fi
  if [ "${CONFORMANCE:-1}" != 0 ] && [ "${LONG:-1}" = 1 ]; then
    timeout 150 /tmp/b-main/pagoda conformance --backends cuda --long-kv 32768 > "$R/conformance_long32k.txt" 2>&1
    echo "conformance long-kv 32768 rc=$?"; grep -E "^  cuda " "$R/conformance_long32k.txt"
  fi
  if [ -d .whl ] && [ "${FLASHINFER:-1}" != 0 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$R/pip.log" 2>&1
    fi_peer() {  # output jsonl, timeout (s); appends to flashinfer.log
      FI_BACKENDS=${FI_BACKENDS:-fa3} PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout "$2" \
        python3 bench/cuda/flashinfer_peer.py "$1" "${FI_FILTER:-}" >> "$R/flashinfer.log" 2>&1
    }
    fi_peer "$R/flashinfer.jsonl" "${FI_TIMEOUT:-300}"
    echo "flashinfer rc=$?"; cat "$R/flashinfer.jsonl"; grep -E "failed" "$R/flashinfer.log" | head -5
    # PEER_ROUNDS=n (n > 1): n - 1 more rounds of ours then FlashInfer (its kernels JIT-compiled
    # by now), and the per-round ratios with their median (bench/cuda/peer_rounds.py).
    if [ "${PEER_ROUNDS:-1}" -gt 1 ]; then
      cp "$R/ours.jsonl" "$R/ours_r1.jsonl"; cp "$R/flashinfer.jsonl" "$R/flashinfer_r1.jsonl"
      for r in $(seq 2 "$PEER_ROUNDS"); do
        bench main "ours_r$r" ""
        fi_peer "$R/flashinfer_r$r.jsonl" 150  # compiled in the first round
      done
      python3 bench/cuda/peer_rounds.py "$R" "$R/peer_rounds.md"
    fi
  fi
fi
