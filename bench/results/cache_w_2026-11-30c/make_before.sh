#!/bin/bash
# Builds the "before" bench: the branch point's (ef8fd17) sources with this branch's
# bench/cache_bench.cpp (same W driver and timers; the driver uses only APIs both have).
# Usage: make_before.sh [DIR]   (run from the repository root)
D=${1:-/tmp/cache2_base}
mkdir -p "$D" && git archive ef8fd17 | tar -x -C "$D"
cp bench/cache_bench.cpp "$D/bench/cache_bench.cpp"
cmake -S "$D" -B "$D/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=OFF -DPAGODA_BUILD_BENCH=ON
cmake --build "$D/build" -j2 --target bench_cache
