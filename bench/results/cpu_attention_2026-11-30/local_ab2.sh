#!/usr/bin/env bash
# Interleaved A/B on the final binary: PAGODA_CPU_BF16=0 (f32 kernels = the previous code) vs
# default (bf16 extend tile) vs PAGODA_CPU_BF16_DECODE=1 (opt-in bf16 decode).
cd /work/wt-cpuspeed
P=/tmp/cs_pagoda_578
C="--backend cpu --kv-dtype bf16 --q-heads 32 --kv-heads 8 --head-dim 128 --page-size 16 --json"
DEC="--op decode --batch 16 --kv-len 8192 --q-len 1 --iters 10"
EXT="--op extend --batch 1 --kv-len 1024 --q-len 1024 --iters 5"
echo "# commit 578b8b7 binary  $(date -u)"
for round in 1 2; do
  for t in 2 1; do
    for mode in f32 bf16; do
      if [ $mode = f32 ]; then E=0; else E=1; fi
      echo "## round=$round threads=$t op=EXT mode=$mode uptime: $(uptime | sed 's/.*load/load/')"
      PAGODA_CPU_BF16=$E $P kernels $C $EXT --threads $t | tail -1
    done
  done
  for mode in f32 default bf16dec; do
    case $mode in f32) ENV="PAGODA_CPU_BF16=0";; default) ENV="PAGODA_CPU_BF16=1";; bf16dec) ENV="PAGODA_CPU_BF16_DECODE=1";; esac
    echo "## round=$round threads=2 op=DEC mode=$mode uptime: $(uptime | sed 's/.*load/load/')"
    env $ENV $P kernels $C $DEC --threads 2 | tail -1
  done
done
