#!/usr/bin/env bash
# One device call: where the sm90 prefill kernel's warps stall. Builds this tree, runs every
# cuda_attention_tests case (PAGODA_REQUIRE_GPU=1), then profiles one launch of the kernel per
# CASES entry (pagoda_cuda_bench case names) with Nsight Compute (--set full, clocks left alone)
# and prints the details page and the SASS source page with its warp-stall samples
# (ncu_<case>.details.txt, ncu_<case>.sass.csv; tools/ncu_stalls.py summarises the latter).
# LONG=1 (default) also runs `pagoda conformance --backends cuda` with and without --long-kv 32768.
# TREES="name:dir ..." also profiles the same CASES on other trees (untracked directories of this
# checkout, as in h200_sm90_ab.sh), built in parallel with this one; their files are
# ncu_<name>_<case>.*. COMMIT names the commit measured. Results: $OUT/prefill_ncu.tgz.
set -uo pipefail
# shellcheck disable=SC1091
source "$(dirname "$0")/device_lib.sh"
BUILD_DIR=${BUILD_DIR:-/tmp/b-main}
device_setup prefill_ncu
TREE_PIDS=
device_build_trees 6 pagoda_cuda_bench
device_build pagoda pagoda_cuda_bench cuda_attention_tests
# shellcheck disable=SC2086
[ -z "$TREE_PIDS" ] || wait $TREE_PIDS
T=$B/tests/cuda
if [ "${TESTS:-1}" != 0 ]; then
  SECONDS=0
  PAGODA_REQUIRE_GPU=1 timeout 300 "$T/cuda_attention_tests" > "$R/tests.log" 2>&1
  echo "tests rc=$? ${SECONDS}s $(grep -E '^\[  (PASSED|FAILED)' "$R/tests.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|Expected|Which is" "$R/tests.log" | head -20
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
profile() {  # profile <file prefix> <pagoda_cuda_bench> <case>
  local c=$3 n=$1$3
  SECONDS=0
  timeout 200 "$NCU" --clock-control none --kernel-name "regex:${KERNEL:-prefill_sm90}" \
    --launch-skip 3 --launch-count 1 --set full --import-source no -f -o "$R/ncu_$n" \
    "$2" "$R/bench_$n.jsonl" "$c" > "$R/ncu_$n.log" 2>&1
  echo "ncu $n rc=$? ${SECONDS}s"
  "$NCU" -i "$R/ncu_$n.ncu-rep" --page details > "$R/ncu_$n.details.txt" 2>&1
  "$NCU" -i "$R/ncu_$n.ncu-rep" --page source --csv --print-source sass \
    > "$R/ncu_$n.sass.csv" 2> "$R/ncu_$n.sass.err"
  # Pipe and memory rates from the raw page (RAW=0 skips): tensor (gmma) pipe activity, L2 and
  # L1 traffic, issue activity.
  if [ "${RAW:-1}" = 1 ]; then
    "$NCU" -i "$R/ncu_$n.ncu-rep" --page raw --csv > "$R/ncu_$n.raw.csv" 2>&1
    python3 - "$R/ncu_$n.raw.csv" > "$R/ncu_$n.pipes.txt" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr, units, vals = rows[0], rows[1], rows[2]
keys = ("pipe_tensor", "gmma", "lts__t_bytes", "lts__t_sectors_srcunit_tex", "l1tex__m_xbar2l1tex",
        "sm__throughput", "inst_issued", "pipe_fma", "pipe_alu", "pipe_xu", "dram__bytes")
for h, u, v in zip(hdr, units, vals):
    if any(k in h for k in keys) and ("pct" in h or "per_second" in h or h.endswith(".sum")):
        print(f"{h} [{u}] {v}")
PY
    head -60 "$R/ncu_$n.pipes.txt"
    gzip -f "$R/ncu_$n.raw.csv"
  fi
  grep -E "Duration|SM Busy|Issue Slots Busy|Registers Per|Warp Cycles Per Issued|No Eligible" \
    "$R/ncu_$n.details.txt" | head -12
  python3 tools/ncu_stalls.py "$R/ncu_$n.sass.csv" 2>&1 | head -30
}
for c in ${CASES:-prefill_causal_b4_s4096 prefill_causal_b16_s1024}; do
  profile "" "$T/pagoda_cuda_bench" "$c"
  for t in ${TREES:-}; do
    profile "${t%%:*}_" "/tmp/b-${t%%:*}/tests/cuda/pagoda_cuda_bench" "$c"
  done
done
if [ "${LONG:-1}" = 1 ]; then
  timeout 120 "$B/pagoda" conformance --backends cuda > "$R/conformance.txt" 2>&1
  echo "conformance rc=$?"; grep -E "^  (cuda|mutant)" "$R/conformance.txt" | head -8
  timeout 150 "$B/pagoda" conformance --backends cuda --long-kv 32768 > "$R/conformance_long32k.txt" 2>&1
  echo "conformance long-kv 32768 rc=$?"; grep -E "^  cuda " "$R/conformance_long32k.txt"
fi
