#!/bin/bash
# Interleaved side-by-side runs of workload W (issue 14, second session): pagoda (this branch's
# bench_cache, Release), SGLang page 1, pagoda again, SGLang page 16; ROUNDS rounds.
# Usage: measure.sh OUT_DIR ROUNDS BENCH_BINARY [FIRST_ROUND]
R=${1:-/tmp/results}; ROUNDS=${2:-4}; BENCH=${3:-build-x/bench/bench_cache}; FIRST=${4:-1}
mkdir -p "$R"
SGL=/work/shared/peers/sglang_radix
for round in $(seq "$FIRST" $((FIRST + ROUNDS - 1))); do
  { date -u; uptime; } > "$R/pagoda_a_r$round.log"
  "$BENCH" --benchmark_filter='W_' >> "$R/pagoda_a_r$round.log" 2>&1
  { date -u; uptime; } > "$R/sglang_p1_r$round.log"
  (cd $SGL && /usr/bin/python3 bench_radix_w.py --page 1 --root $SGL --json "$R/sglang_p1_r$round.json") >> "$R/sglang_p1_r$round.log" 2>&1
  { date -u; uptime; } > "$R/pagoda_b_r$round.log"
  "$BENCH" --benchmark_filter='W_' >> "$R/pagoda_b_r$round.log" 2>&1
  { date -u; uptime; } > "$R/sglang_p16_r$round.log"
  (cd $SGL && /usr/bin/python3 bench_radix_w.py --page 16 --root $SGL --json "$R/sglang_p16_r$round.json") >> "$R/sglang_p16_r$round.log" 2>&1
done
if [ "$FIRST" = 1 ]; then
  { date -u; uptime; } > "$R/pagoda_micro.log"
  "$BENCH" --benchmark_filter='BM_' --benchmark_min_time=0.2 >> "$R/pagoda_micro.log" 2>&1
fi
echo done > "$R/DONE"
