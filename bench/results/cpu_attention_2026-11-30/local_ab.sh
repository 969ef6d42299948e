#!/usr/bin/env bash
# Interleaved A/B: same binary, PAGODA_CPU_BF16=0 (f32 kernels, the previous code) vs default.
cd /work/wt-cpuspeed
P=/tmp/cs_pagoda_final
C="--backend cpu --kv-dtype bf16 --q-heads 32 --kv-heads 8 --head-dim 128 --page-size 16 --json"
DEC="--op decode --batch 16 --kv-len 8192 --q-len 1 --iters 10"
EXT="--op extend --batch 1 --kv-len 1024 --q-len 1024 --iters 5"
echo "# commit $(git rev-parse --short HEAD)  $(date -u)"
for round in 1 2; do
  for t in 2 1; do
    for op in EXT DEC; do
      for mode in f32 bf16; do
        if [ $mode = f32 ]; then E=0; else E=1; fi
        echo "## round=$round threads=$t op=$op mode=$mode uptime: $(uptime | sed 's/.*load/load/')"
        PAGODA_CPU_BF16=$E $P kernels $C ${!op} --threads $t | tail -1
      done
    done
  done
done
