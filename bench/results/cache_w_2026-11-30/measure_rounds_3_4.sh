#!/bin/bash
# Interleaved side-by-side runs of workload W: pagoda after, SGLang page 1, pagoda before, SGLang page 16.
R=${1:-/tmp/results}; ROUNDS=${2:-2}
mkdir -p $R
SGL=/work/shared/peers/sglang_radix
for round in $(seq 3 4); do
  { date -u; uptime; } > $R/pagoda_after_r$round.log
  /work/main/build-cache/bench/bench_cache --benchmark_filter='W_' >> $R/pagoda_after_r$round.log 2>&1
  { date -u; uptime; } > $R/sglang_p1_r$round.log
  (cd $SGL && /usr/bin/python3 bench_radix_w.py --page 1 --root $SGL --json $R/sglang_p1_r$round.json) >> $R/sglang_p1_r$round.log 2>&1
  { date -u; uptime; } > $R/pagoda_before_r$round.log
  /tmp/before/build/bench/bench_cache --benchmark_filter='W_' >> $R/pagoda_before_r$round.log 2>&1
  { date -u; uptime; } > $R/sglang_p16_r$round.log
  (cd $SGL && /usr/bin/python3 bench_radix_w.py --page 16 --root $SGL --json $R/sglang_p16_r$round.json) >> $R/sglang_p16_r$round.log 2>&1
done
echo done > $R/DONE_34
echo done > $R/DONE_34
