#!/usr/bin/env bash
# One bounded device call (nvidia-h200-x2) for the 2026-11-30 session's GPU evidence, because the
# session's device time is short: one build, one 1B checkpoint, then
#   tp    — tensor parallelism on the 1B layout: tp 1 / tp 2 NCCL-only / tp 2 IPC all-reduce at
#           batch 1 and 64 (same run, same binary)          [scripts/h200x2_tp.sh has the 8B runs]
#   spec  — cuda_spec_tests, then `pagoda bench --spec` A/Bs: self-draft overhead, n-gram on
#           prompts that repeat a span, n-gram on random prompts   [full set: scripts/h200_spec.sh]
#   serve — bench/serve_bench.py at concurrency 1/16/64 and the comparison with `pagoda bench`
#           (one repeat)                                     [full set: bench/serve_h200.sh]
# Each part has its own time limit and is skipped if the build lacks it. Carry `.debs`
# (scripts/gpu_deps.sh fetch). $OUT gets session.log and logs.tgz.
set -uo pipefail
FINAL=${OUT:-/tmp/pagoda_out}
OUT=/tmp/session_out
mkdir -p "$OUT" "$FINAL"
trap '(cd "$OUT" && tar czf "$FINAL/logs.tgz" --exclude=logs.tgz . 2>/dev/null); cp "$OUT/session.log" "$FINAL/" 2>/dev/null' EXIT
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
source scripts/gpu_deps.sh env
log() { echo "$*" | tee -a "$OUT/session.log"; }
t_start=$(date +%s)
el() { echo "$(( $(date +%s) - t_start )) s"; }
log "commit $(git log -1 --format=%h 2>/dev/null) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
B=/tmp/b-all
P=$B/pagoda
cmake -S . -B $B -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DPAGODA_BUILD_BENCH=OFF \
  > "$OUT/build.log" 2>&1 && ninja -C $B pagoda cuda_spec_tests >> "$OUT/build.log" 2>&1 \
  || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -30 | tee -a "$OUT/session.log"; exit 1; }
log "build done ($(el)); $(grep -ci 'cpp-httplib' "$OUT/build.log") httplib lines; $(grep -i 'NCCL:' "$OUT/build.log" | head -1)"
C=/tmp/llama-1b
[ -f $C/config.json ] || python3 tools/make_checkpoint.py --layout 1b --dtype bf16 --seed 0 \
  --out $C > "$OUT/checkpoint.log" 2>&1 || { tail -5 "$OUT/checkpoint.log" | tee -a "$OUT/session.log"; exit 1; }
log "checkpoint ($(el))"
summ() {  # file: decode step and tok/s from a bench JSON
  python3 -c "import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print('decode_step_ms', round(d['decode_step_ms'],3), 'decode tok/s', round(d['decode_tokens_per_s'],1), 'graph steps', d['cuda_graph_steps'], 'of', d['decode_steps'])" "$1" 2>&1 | tail -1
}
# ---- tp
tp_one() {  # BS TP VARIANT
  local name=tp_1b_b$1_tp$2$3 env=()
  [ "$3" = _nccl ] && env=(PAGODA_CUSTOM_ALLREDUCE=0)
  env "${env[@]}" timeout 60 $P bench --model $C --backend cuda --tp $2 --json --requests $1 \
    --max-running $1 --input-len 128 --output-len 128 --pool-tokens 65536 --chunk-size 0 \
    --page-size 16 > "$OUT/$name.json" 2> "$OUT/$name.err"
  log "$name rc=$? $(summ "$OUT/$name.json") $(grep -h 'tensor parallel' "$OUT/$name.err" | head -1)"
}
for bs in 1 64; do tp_one $bs 1 ""; tp_one $bs 2 _nccl; tp_one $bs 2 ""; done
log "tp done ($(el))"
# ---- spec
timeout 60 $B/tests/cuda/cuda_spec_tests > "$OUT/cuda_spec_tests.log" 2>&1
log "cuda_spec_tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_spec_tests.log" | tr '\n' ' ')"
spec_one() {  # NAME ARGS...
  local name=$1; shift
  timeout 70 $P bench --model $C --backend cuda --json "$@" > "$OUT/spec_$name.json" 2> "$OUT/spec_$name.err"
  log "spec $name rc=$? $(tail -c 900 "$OUT/spec_$name.json" | tr '\n' ' ')"
}
spec_one self_draft --spec draft --spec-steps 3 --spec-topk 1 --spec-draft-tokens 4 \
  --workload random --requests 4 --input-len 256 --output-len 256 --max-running 1
spec_one ngram_chain --spec ngram --spec-steps 6 --spec-topk 1 --spec-draft-tokens 7 \
  --workload repeat --requests 4 --input-len 512 --output-len 512 --max-running 1
spec_one ngram_random --spec ngram --spec-steps 4 --spec-topk 1 --spec-draft-tokens 5 \
  --workload random --requests 4 --input-len 512 --output-len 256 --max-running 1
log "spec done ($(el))"
# ---- serve
if $P serve --help > /dev/null 2>&1; then
  timeout 120 python3 bench/serve_bench.py --pagoda $P --model $C --out "$OUT/serve" \
    --concurrency 1,16,64 --num-prompts 0 --input-median 256 --output-median 128 \
    --max-input 2048 --max-output 512 --pool-tokens 262144 --max-running 64 \
    --compare-input-len 512 --compare-output-len 256 --compare-requests 256 --compare-repeats 1 \
    > "$OUT/serve_bench.log" 2>&1
  log "serve rc=$? ($(el))"; tail -25 "$OUT/serve_bench.log" >> "$OUT/session.log"
else
  log "serve: not in this build"
fi
log "total $(el)"
