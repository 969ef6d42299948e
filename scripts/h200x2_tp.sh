#!/usr/bin/env bash
# Tensor parallelism on 2 GPUs (issue 13), for the device tool's nvidia-h200-x2 kind:
#   run: bash scripts/h200x2_tp.sh check   (build, GPU regression tests, tp 1 vs 2 exactness, kill)
#        bash scripts/h200x2_tp.sh bench   (8B layout, decode tok/s at batch 1 and 64, tp 1 vs 2)
# Carry `.debs` (scripts/gpu_deps.sh fetch). Builds into /tmp/b-tp (kept while the machine is
# warm). Logs go to $OUT.
set -uo pipefail
FINAL=${OUT:-/tmp/pagoda_out}
OUT=/tmp/tp_out  # everything here; $FINAL gets tp.log and logs.tgz (the device returns 8 files)
mkdir -p "$OUT" "$FINAL"
trap '(cd "$OUT" && tar czf "$FINAL/logs.tgz" --exclude=logs.tgz . 2>/dev/null); cp "$OUT/tp.log" "$FINAL/" 2>/dev/null' EXIT
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
B=/tmp/b-tp
P=$B/pagoda
source scripts/gpu_deps.sh env
log() { echo "$*" | tee -a "$OUT/tp.log"; }
if [ ! -x "$P" ] || [ "${REBUILD:-0}" = 1 ]; then
  t0=$(date +%s)
  cmake -S . -B $B -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DPAGODA_BUILD_BENCH=OFF \
    > "$OUT/build.log" 2>&1 && ninja -C $B pagoda cuda_engine_tests model_kernels_tests \
    >> "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -40; exit 1; }
  log "build $(( $(date +%s) - t0 )) s; $(grep -i nccl "$OUT/build.log" | head -1)"
fi
ckpt() {  # ckpt LAYOUT -> /tmp/ckpt-LAYOUT
  [ -f /tmp/ckpt-$1/config.json ] || python3 tools/make_checkpoint.py --layout $1 --dtype bf16 \
    --out /tmp/ckpt-$1 > /dev/null
  echo /tmp/ckpt-$1
}
case "${1:-check}" in
check)
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvidia-smi topo -m; git log -1 --format=%h 2>/dev/null; } > "$OUT/gpu.txt" 2>&1
  for t in cuda_engine_tests model_kernels_tests; do
    f=$(find $B -name $t -type f | head -1)
    CUDA_VISIBLE_DEVICES=0 timeout 120 "$f" > "$OUT/$t.log" 2>&1; log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
  done
  C=$(ckpt 1b)
  python3 - "$OUT/prompts.txt" <<'PY'
import random, sys
r = random.Random(1313)
with open(sys.argv[1], "w") as f:
    for i in range(20):
        f.write(",".join(str(r.randrange(100000)) for _ in range(r.randrange(16, 300))) + "\n")
PY
  for dt in f32 bf16; do
    for tp in 1 2; do
      t0=$(date +%s.%N)
      timeout 300 $P generate --model $C --backend cuda --dtype $dt --tp $tp --batch-file "$OUT/prompts.txt" \
        --max-new-tokens 24 --ignore-eos > "$OUT/gen_${dt}_tp$tp.jsonl" 2> "$OUT/gen_${dt}_tp$tp.err"
      log "generate $dt tp$tp rc=$? $(python3 -c "print(round($(date +%s.%N)-$t0,1))") s"
    done
    python3 - "$OUT/gen_${dt}_tp1.jsonl" "$OUT/gen_${dt}_tp2.jsonl" $dt <<'PY' | tee -a "$OUT/tp.log"
import json, sys
a = [json.loads(l)["output_token_ids"] for l in open(sys.argv[1])]
b = [json.loads(l)["output_token_ids"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 20, (len(a), len(b))
same = sum(x == y for x, y in zip(a, b))
first = sum(x[0] == y[0] for x, y in zip(a, b))
print(f"{sys.argv[3]}: tp2 == tp1 on {same}/20 full outputs (24 tokens), first tokens {first}/20")
PY
  done
  # A killed follower ends the job with an error naming the rank.
  $P bench --model $C --backend cuda --tp 2 --requests 64 --max-running 64 --input-len 64 \
    --output-len 20000 --pool-tokens 1400000 > "$OUT/kill.out" 2> "$OUT/kill.err" &
  lead=$!
  sleep 45  # both ranks loaded and decoding
  fol=$(pgrep -f "tp-follower" | head -1)
  t0=$(date +%s.%N); kill -9 "$fol"; wait $lead; rc=$?
  log "killed follower $fol: leader exited rc=$rc after $(python3 -c "print(round($(date +%s.%N)-$t0,2))") s: $(grep -i 'rank' "$OUT/kill.err" | tail -1)"
  ;;
bench)
  # tp 1 vs tp 2 in one run; "nccl" = tp 2 with the IPC all-reduce off (PAGODA_CUSTOM_ALLREDUCE=0).
  one() {  # one LAYOUT BS TP VARIANT
    local C=$(ckpt $1) name=bench_$1_b$2_tp$3$4 env=()
    [ "$4" = _nccl ] && env=(PAGODA_CUSTOM_ALLREDUCE=0)
    env "${env[@]}" timeout 280 $P bench --model $C --backend cuda --tp $3 --json --requests $2 \
      --max-running $2 --input-len 128 --output-len 128 --pool-tokens 65536 --chunk-size 0 \
      --page-size 16 > "$OUT/$name.json" 2> "$OUT/$name.err"
    log "$1 b$2 tp$3$4 rc=$? $(python3 -c "import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print('decode_step_ms', round(d['decode_step_ms'],3), 'decode tok/s', round(d['decode_tokens_per_s'],1), 'graph steps', d['cuda_graph_steps'])" "$OUT/$name.json" 2>&1 | tail -1) $(grep -h 'tensor parallel' "$OUT/$name.err" | head -1)"
  }
  for bs in 1 64; do one 1b $bs 1 ""; one 1b $bs 2 _nccl; one 1b $bs 2 ""; done
  for bs in 1 64; do one 8b $bs 1 ""; one 8b $bs 2 ""; done
  ;;
esac
