#!/bin/bash
# Interleaved side-by-side runs of workload W (issue 14, third session): pagoda after (this
# branch's bench_cache, Release), SGLang page 1, pagoda before (the branch point ef8fd17's cache
# and kv built with this branch's bench driver, by make_before.sh), SGLang page 16; ROUNDS rounds.
# Usage: measure.sh OUT_DIR ROUNDS AFTER_BENCH BEFORE_BENCH [FIRST_ROUND]  (absolute paths: the
# SGLang runs cd into the harness folder)
R=${1:-/tmp/results}; ROUNDS=${2:-4}; AFTER=${3:-build-x/bench/bench_cache}
BEFORE=${4:-/tmp/cache2_base/build/bench/bench_cache}; FIRST=${5:-1}
mkdir -p "$R"
SGL=/work/shared/peers/sglang_radix
for round in $(seq "$FIRST" $((FIRST + ROUNDS - 1))); do
  { date -u; uptime; } > "$R/pagoda_a_r$round.log"
  "$AFTER" --benchmark_filter='W_' >> "$R/pagoda_a_r$round.log" 2>&1
  { date -u; uptime; } > "$R/sglang_p1_r$round.log"
  (cd $SGL && /usr/bin/python3 bench_radix_w.py --page 1 --root $SGL --json "$R/sglang_p1_r$round.json") >> "$R/sglang_p1_r$round.log" 2>&1
  { date -u; uptime; } > "$R/before_r$round.log"
  "$BEFORE" --benchmark_filter='W_' >> "$R/before_r$round.log" 2>&1
  { date -u; uptime; } > "$R/sglang_p16_r$round.log"
  (cd $SGL && /usr/bin/python3 bench_radix_w.py --page 16 --root $SGL --json "$R/sglang_p16_r$round.json") >> "$R/sglang_p16_r$round.log" 2>&1
done
echo done > "$R/DONE"
