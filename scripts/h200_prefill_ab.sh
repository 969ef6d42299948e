#!/usr/bin/env bash
# One device call: this tree against an older commit's tree on the same machine, for the prefill
# kernels. OLD names a directory holding the older tree (e.g. `git archive f719c3b | tar -x -C
# old_f719`, left untracked so the device copy carries it). Builds both (sm_90a), runs this
# tree's cuda_attention_tests (PAGODA_REQUIRE_GPU=1), then pagoda_cuda_bench's prefill cases
# twice, interleaved: old and new sm90 (default schedule), new plain, old and new mma.sync.
# Logs and JSON lines land in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/pagoda_out}; mkdir -p "$OUT"
cd "$(dirname "$0")/.." || exit 1
OLD=${OLD:?OLD=<directory of the older tree>}
# shellcheck disable=SC1091
[ -d .debs ] && source scripts/gpu_deps.sh env
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  echo "commit ${COMMIT:-unknown} vs $OLD $(date -u +%FT%TZ)"; } | tee "$OUT/gpu.txt"
build() {  # name, source dir, targets...
  local n=$1 d=$2; shift 2
  cmake -S "$d" -B "/tmp/b-$n" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DPAGODA_BUILD_BENCH=OFF > "$OUT/cfg_$n.log" 2>&1 &&
    ninja -C "/tmp/b-$n" -j8 "$@" > "$OUT/build_$n.log" 2>&1
  echo "build $n rc=$?"
}
build new . pagoda_cuda_bench cuda_attention_tests &
build old "$OLD" pagoda_cuda_bench &
wait
PAGODA_REQUIRE_GPU=1 timeout 120 /tmp/b-new/tests/cuda/cuda_attention_tests > "$OUT/tests.log" 2>&1
echo "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.log" | tr '\n' ' ')"
for r in 1 2; do
  for n in old new; do
    timeout 60 /tmp/b-$n/tests/cuda/pagoda_cuda_bench "$OUT/${n}_sm90_$r.jsonl" prefill > /dev/null
    PAGODA_SM90_PREFILL=0 timeout 30 /tmp/b-$n/tests/cuda/pagoda_cuda_bench "$OUT/${n}_mma_$r.jsonl" prefill_causal_b4_s4096 > /dev/null
  done
  PAGODA_SM90_SCHED=plain timeout 60 /tmp/b-new/tests/cuda/pagoda_cuda_bench "$OUT/new_plain_$r.jsonl" prefill > /dev/null
done
for f in "$OUT"/*.jsonl; do
  python3 -c "
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l); print(sys.argv[1].split('/')[-1].ljust(20), j['case'][:30].ljust(30), j['ms'])
" "$f"
done
