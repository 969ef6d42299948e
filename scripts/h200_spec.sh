#!/usr/bin/env bash
# One device call for speculative decoding (issue 11) on an H200: builds `pagoda` and
# `cuda_spec_tests` for sm_90a, runs the GPU spec tests, writes a random Llama-3.2-1B-layout
# checkpoint (tools/make_checkpoint.py; needs torch + transformers + tokenizers), then runs
# `pagoda bench --spec ...` A/B runs (each: the same workload without, then with speculation):
#   self_draft   — the target as its own draft, topk 1: the pure overhead of a round
#                  (verify and draft forwards replayed from CUDA graphs)
#   self_draft_eager — the same with --spec-graph-tokens 0 (eager verify/draft: the graph gain)
#   ngram_chain  — prompt lookup, chain of 6, on prompts that repeat a span (editing/retrieval)
#   ngram_tree   — prompt lookup, topk 4 tree of 16 tokens, same workload
#   ngram_random — random prompts (little to accept): the switch-off keeps the loss small
#   ngram_b16    — 16 running requests
#   f32_lossless — f32 weights: greedy outputs must be identical (bf16 may flip near ties)
# Runs are in priority order (the graph A/B first) so a cut-off run still answers the main
# question. Outputs land in $OUT (gpu.txt, build.log, spec_tests.log, <name>.json).
set -uo pipefail
OUT=${OUT:-/tmp/pagoda_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
date -u +%Y-%m-%dT%H:%MZ >> "$OUT/gpu.txt"
git rev-parse HEAD >> "$OUT/gpu.txt" 2>/dev/null
if compgen -G ".debs/*.deb" > /dev/null; then  # carried: scripts/gpu_deps.sh fetch here
  # shellcheck disable=SC1091
  source scripts/gpu_deps.sh env
fi
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1
B=${BUILD_DIR:-build-h200s}
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DPAGODA_BUILD_BENCH=OFF > "$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
ninja -C $B pagoda cuda_spec_tests >> "$OUT/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
echo "== GPU spec tests"
timeout 180 "$B/tests/cuda/cuda_spec_tests" > "$OUT/spec_tests.log" 2>&1; echo "spec tests rc=$?"
grep -E "^\[  |^\[.*\] [0-9]+ rounds|^\[.*max \|logit|^seed|Failure|Expected|Which" "$OUT/spec_tests.log" | head -40
CKPT=${CKPT:-/tmp/llama-1b}
if [ ! -f "$CKPT/config.json" ]; then
  python3 tools/make_checkpoint.py --layout 1b --dtype bf16 --seed 0 --out "$CKPT" \
    > "$OUT/checkpoint.log" 2>&1 || { tail -20 "$OUT/checkpoint.log"; exit 1; }
fi
P="$B/pagoda bench --model $CKPT --backend cuda --json"
run() {  # name, args...
  local name=$1; shift
  echo "== $name: $*"
  timeout 240 $P "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"; echo "rc=$?"
  cat "$OUT/$name.json"; tail -2 "$OUT/$name.err"
}
run self_draft   --spec draft --spec-steps 3 --spec-topk 1 --spec-draft-tokens 4 \
                 --workload random --requests 8 --input-len 256 --output-len 256 --max-running 1
run self_draft_eager --spec draft --spec-steps 3 --spec-topk 1 --spec-draft-tokens 4 \
                 --spec-graph-tokens 0 \
                 --workload random --requests 8 --input-len 256 --output-len 256 --max-running 1
run ngram_random --spec ngram --spec-steps 4 --spec-topk 1 --spec-draft-tokens 5 \
                 --workload random --requests 8 --input-len 512 --output-len 256 --max-running 1
run ngram_chain  --spec ngram --spec-steps 6 --spec-topk 1 --spec-draft-tokens 7 \
                 --workload repeat --requests 8 --input-len 512 --output-len 512 --max-running 1
run self_tree    --spec draft --spec-steps 3 --spec-topk 4 --spec-draft-tokens 8 \
                 --workload random --requests 8 --input-len 256 --output-len 256 --max-running 1
run f32_lossless --spec draft --spec-steps 3 --spec-topk 2 --spec-draft-tokens 6 --dtype f32 \
                 --workload repeat --requests 4 --input-len 256 --output-len 128 --max-running 1
run ngram_tree   --spec ngram --spec-steps 6 --spec-topk 4 --spec-draft-tokens 16 \
                 --workload repeat --requests 8 --input-len 512 --output-len 512 --max-running 1
run ngram_b16    --spec ngram --spec-steps 6 --spec-topk 1 --spec-draft-tokens 7 \
                 --workload repeat --requests 32 --input-len 512 --output-len 256 --max-running 16
