#!/usr/bin/env bash
# One device call for speculative decoding (issue 11) on an H200: builds `pagoda` and
# `cuda_spec_tests` for sm_90a (in $BUILD_DIR, reused while the machine stays warm), runs the GPU
# spec tests, writes a random Llama-3.2-1B-layout checkpoint (tools/make_checkpoint.py; needs
# torch + transformers + tokenizers), then runs `pagoda bench --spec ...` A/B runs (each: the same
# workload without, then with speculation, in one process; the JSON has the per-phase round time):
#   self_draft       — the target as its own draft, topk 1: the pure overhead of a round
#   self_draft_eager — the same with --spec-graph-tokens 0 (eager verify/draft: the graph gain)
#   self_draft_4k    — the same at a 4,096-token context (verify vs decode attention cost)
#   ngram_random     — random prompts (nothing to accept): the switch-off keeps the loss small
#   ngram_chain      — prompt lookup, chain of 6, on prompts that repeat a span
#   self_tree        — self-draft, topk 4, tree of 8
#   f32_lossless     — f32 weights: greedy outputs must be identical (bf16 may flip near ties)
#   ngram_b16        — 16 running requests
#   copy_chain / copy_tree / copy_4k / copy_b16 — n-gram drafting on the `repeat` workload with the 1B
#                      layout whose weights copy (tools/make_copy_model.py: an induction circuit,
#                      written here first when $CKPT_COPY is missing): the editing/retrieval case
# RUNS="a b ..." picks runs (default: all, in this order); SUFFIX is appended to their file names
# (e.g. SUFFIX=_nopdl RUN_ENV=PAGODA_PDL=0 for an A/B in the same call). Results: $OUT/spec.tgz (every log and
# JSON) plus the summary on stdout.
set -uo pipefail
# shellcheck disable=SC1091
source "$(dirname "$0")/device_lib.sh"
device_setup spec
device_build pagoda cuda_spec_tests
echo "== GPU spec tests"
PAGODA_REQUIRE_GPU=1 timeout 180 "$B/tests/cuda/cuda_spec_tests" > "$R/spec_tests.log" 2>&1
echo "spec tests rc=$?"
grep -E "^\[  |rounds|^seed|Failure|Expected|Which" "$R/spec_tests.log" | head -40
CKPT=${CKPT:-/tmp/llama-1b}
if [ ! -f "$CKPT/config.json" ]; then
  timeout 300 python3 tools/make_checkpoint.py --layout 1b --dtype bf16 --seed 0 --out "$CKPT" \
    > "$R/checkpoint.log" 2>&1 || { tail -20 "$R/checkpoint.log"; exit 1; }
fi
P="$B/pagoda bench --model $CKPT --backend cuda --json"
run() {  # name, args... (RUN_ENV="A=1 B=2" run ... sets variables for that run only)
  local name=$1; shift
  case " ${RUNS:-all} " in *" all "*|*" $name "*) ;; *) return ;; esac
  local file=$name${SUFFIX:-}
  echo "== $file: ${RUN_ENV:-} $*"
  env ${RUN_ENV:-} timeout 240 $P "$@" > "$R/$file.json" 2> "$R/$file.err"; echo "rc=$?"
  python3 - "$R/$file.json" <<'PY' || tail -3 "$R/$file.err"
import json, sys
d = json.load(open(sys.argv[1]))
print(json.dumps(d)[:1500])
PY
}
D3="--spec draft --spec-steps 3 --spec-topk 1 --spec-draft-tokens 4"
run self_draft       $D3 --workload random --requests 8 --input-len 256 --output-len 256 --max-running 1
run self_draft_eager $D3 --spec-graph-tokens 0 \
                     --workload random --requests 8 --input-len 256 --output-len 256 --max-running 1
run self_draft_4k    $D3 --workload random --requests 4 --input-len 4096 --output-len 256 --max-running 1
# Where a verify-shaped forward's extra time goes: the mma.sync prefill kernel instead of the
# sm90 one, and m <= 4 GEMMs on small_m_gemm instead of cuBLAS.
RUN_ENV=PAGODA_SM90_PREFILL=0 run self_draft_mma \
  $D3 --workload random --requests 8 --input-len 256 --output-len 256 --max-running 1
RUN_ENV=PAGODA_SMALL_M_MAX=4 run self_draft_smallm4 \
  $D3 --workload random --requests 8 --input-len 256 --output-len 256 --max-running 1
run ngram_random --spec ngram --spec-steps 4 --spec-topk 1 --spec-draft-tokens 5 \
                 --workload random --requests 8 --input-len 512 --output-len 256 --max-running 1
run ngram_chain  --spec ngram --spec-steps 6 --spec-topk 1 --spec-draft-tokens 7 \
                 --workload repeat --requests 8 --input-len 512 --output-len 512 --max-running 1
run self_tree    --spec draft --spec-steps 3 --spec-topk 4 --spec-draft-tokens 8 \
                 --workload random --requests 8 --input-len 256 --output-len 256 --max-running 1
run f32_lossless --spec draft --spec-steps 3 --spec-topk 2 --spec-draft-tokens 6 --dtype f32 \
                 --workload repeat --requests 4 --input-len 256 --output-len 128 --max-running 1
run ngram_b16    --spec ngram --spec-steps 6 --spec-topk 1 --spec-draft-tokens 7 \
                 --workload repeat --requests 32 --input-len 512 --output-len 256 --max-running 16

copy_wanted() { case " ${RUNS:-all} " in *" all "*|*" copy_"*) return 0 ;; esac; return 1; }
if copy_wanted; then
  CKPT_COPY=${CKPT_COPY:-/tmp/llama-1b-copy}
  if [ ! -f "$CKPT_COPY/config.json" ]; then
    echo "== constructing the copy model"
    timeout 300 python3 tools/make_copy_model.py --src "$CKPT" --out "$CKPT_COPY" \
      > "$R/make_copy.log" 2>&1; echo "make_copy rc=$?"
    cat "$R/make_copy.log"
  fi
  P="$B/pagoda bench --model $CKPT_COPY --backend cuda --json"
  run copy_chain --spec ngram --spec-steps 6 --spec-topk 1 --spec-draft-tokens 7 \
                 --workload repeat --requests 8 --input-len 512 --output-len 256 --max-running 1
  run copy_tree  --spec ngram --spec-steps 6 --spec-topk 4 --spec-draft-tokens 16 \
                 --workload repeat --requests 8 --input-len 512 --output-len 256 --max-running 1
  run copy_4k    --spec ngram --spec-steps 6 --spec-topk 1 --spec-draft-tokens 7 \
                 --workload repeat --requests 4 --input-len 4096 --output-len 256 --max-running 1
  run copy_b16   --spec ngram --spec-steps 6 --spec-topk 1 --spec-draft-tokens 7 \
                 --workload repeat --requests 32 --input-len 512 --output-len 256 --max-running 16
fi
