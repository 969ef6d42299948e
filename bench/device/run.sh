#!/usr/bin/env bash
# The one entry point for GPU evidence: builds pagoda for the lent GPU, runs the GPU tests and
# regenerates every GPU table, writing ONE JSON record per run (bench/device/record.py) and the
# Markdown tables generated from it (bench/tables.py).
#
# Usage (from the repository root, on the device machine; $OUT is the device tool's folder):
#   bash bench/device/run.sh KIND [GROUP] [--commit SHA] [--rounds N] [--budget S] [--sanitize]
#                            [--pagoda BIN]
#   KIND   h100 | h200 (one GPU) or x2 | h200x2 (two GPUs, tensor parallelism), or cpu (no GPU:
#          the hybrid group at small sizes on the cpu backend, e.g. on a development host)
#   GROUP  one GPU:  tests    build, GPU tests (ctest -L gpu: every CUDA gtest binary and
#                             `pagoda conformance --backends cuda`)
#                    kernels  build, the kernel table: pagoda vs cuDNN, flash SDPA and FlashInfer
#                             in N interleaved rounds (FlashInfer compiles its kernels meanwhile,
#                             from the start of the call). Apart from the tests since 50a3320:
#                             build and tests took 383 s of the call, and the one round left was
#                             cut before the fp8-KV and MLA peer rows twice (14c5f24, 50a3320)
#                    engine   build, engine_real (1B and 8B layouts vs transformers in the same
#                             call), speculative decoding A/Bs (each without, then with)
#                    agree    build, the first token vs transformers fp32 on 20 prompts of 300
#                             ids (bench/agreement_vs_transformers.py --device cuda): the
#                             DeepSeek-V2 / V3 tiny layouts, DeepSeek-V2-Lite's attention in 4
#                             layers (deepseek-v2-lite-narrow: its prompts prefill in MLA's
#                             expanded form), gemma3-1b, bamba-1b and 1b
#                    serve    build, `pagoda serve` vs `pagoda bench` (same engine settings),
#                             and compute-sanitizer with --sanitize
#                    python   build (with the Python package), the torch/CUDA tests of
#                             pagoda.flashinfer, pagoda.flashinfer vs FlashInfer in one process
#                             (bench/python_vs_flashinfer.py), pagoda.LLM vs `pagoda bench`
#                    hicache  build, issue 43's multi-turn workload (live KV >= 4x the device
#                             pool) on the 1B and 8B layouts: device-only radix cache, then the
#                             host tier (write_through), the same conversations (1B chat also
#                             with a 1x host tier over a file storage tier); the load-back
#                             probe (bench --workload loadback); and the pinned host -> device
#                             copy bandwidth (torch) in the same call
#                    profile  build, a decode step profile per layout and batch (1B at batch 1
#                             and 64, then 8B at batch 1 if the budget allows): the unprofiled
#                             step (`pagoda bench --json`, 128 in / 128 out, CUDA graphs) and ncu
#                             per-kernel time and DRAM bytes of the last 4 decode steps of a run
#                             at context 192 (--graph-profiling node: kernels timed inside the
#                             graphs); needs ncu (nsys does not run on the device); at 1B batch 1
#                             also the unprofiled step with each PROFILE_AB kernel option
#                             against none, 2 alternating rounds (the decode split-KV floor)
#                    amx      build, issue 51 on the device host's CPU (a Xeon; the GPU idles):
#                             the AMX / oneDNN tests (CpuGemm, model forward, EngineCpuGemm),
#                             `pagoda conformance --backends amx`, bench/cpu_model_vs_torch.py (the
#                             1B layout, 1 and 8 requests, --cpu-gemm amx and onednn vs transformers bf16
#                             generate on the same prompts, at 2 and all threads, rows cut by a
#                             budget) and bench/cpu_vs_torch.py (the cpu and amx attention
#                             backends vs torch SDPA at 2 and all threads)
#                    hybrid   build, issue 49's hybrid-model benchmarks (hybrid_stage below): the
#                             Gemma-3-1B layout at 32k tokens with the sliding-window pool vs one
#                             full pool (KV bytes per request, requests that fit one byte budget,
#                             decode step); the Bamba layout's decode step at 8k vs 64k with the
#                             attention kernel at both lengths, the Mamba2 scan (pagoda kernels
#                             --op linear-*) against the copy bandwidth, and TTFT of a cached 8k
#                             prefix (state snapshot restored) vs a cold one
#                    dsa      build, issue 50: the DSA decode step (pagoda kernels --op
#                             dsa-decode, kernels_dsa.h): the cuda backend's indexer (scores +
#                             top-k of 2,048) + sparse MLA vs dense MLA decode at the same
#                             context, batch 16 at 32k and 128k (h_q 128) and 128k at h_q 16;
#                             then the engine on the deepseek-v2-lite layout (engine_real.py,
#                             no peer: batch 1 and 64 against the step roofline, a 2,048-token
#                             prefill against the GEMM rate and absorbed, an 8,192-token prompt
#                             in chunks of 1,024 with one key window vs windows of 1,024 keys)
#                    ab_kernels  build (the attention tests and the kernel benchmark only), the
#                             sm90 prefill's GPU tests, compute-sanitizer memcheck and racecheck
#                             on their small test, then kernel-option variants against the
#                             defaults on issue 53's shapes (AB_VARIANTS below), every process in
#                             the same call, in N interleaved rounds (the order reversed every
#                             other round); no peers (the kernels group times them)
#                    all      every group above but profile, hybrid and ab_kernels (longer than
#                             one 10-minute device call: one group a call)
#          no GPU:   hybrid   the same at CPU sizes (default for kind cpu): gemma3-1b-narrow at 4k,
#                             bamba-small at 1k vs 8k, a 2k prefix, f32, backend cpu
#          two GPUs: tp       build, TP decode (tp 1 vs tp 2, 1B and 8B) and tp 2 == tp 1 greedy
#                             outputs (default)
#   --commit SHA   the commit measured (the device copy of the tree may have no .git)
#   --rounds N     interleaved kernel rounds (default 5): ours, peers, ours, peers, ...
#   --budget S     kernel rounds and profile runs end within S seconds of this run's start
#                  (default 550): a round starts only with 60 s left (a profile run with 150 s,
#                  330 s when the 8B checkpoint is still to write) and its steps are cut at the
#                  budget, so the call ends inside its 10-minute limit; the record holds the
#                  rounds (rows, profile runs) that ran
#   --filter RE    tests group: only the GPU test binaries whose names match the extended regex
#                  RE are built and run (ctest -R), e.g. --filter 'cuda_engine_tests'
#   --sanitize     compute-sanitizer memcheck and racecheck on a quick subset of the attention
#                  tests (decode, extend with prefix, tree mask, MLA decode) in the group's call
#   --pagoda BIN   use this pagoda binary instead of building one (no build stage)
# Carry `.debs` (scripts/gpu_deps.sh fetch: libraries the image lacks) and `.whl` (FlashInfer
# 0.5.3 wheels: flashinfer_python, apache_tvm_ffi, nvidia_cudnn_frontend) in the device call.
# Results in $OUT: record_<kind>_<group>.json, tables_<kind>_<group>.md, logs_<kind>_<group>.tgz
# (every raw log), summary.txt. Copy the record into bench/results/records/ and regenerate
# bench/results/tables.md with `python3 bench/tables.py bench/results/records/*.json`.
set -uo pipefail
KIND=${1:?usage: run.sh KIND [GROUP] [options] (see the header)}
shift
case "$KIND" in
  h100|h200) GPUS=1; GROUP=all ;;
  x2|h200x2) GPUS=2; GROUP=tp ;;
  cpu) GPUS=0; GROUP=hybrid ;;
  *) echo "run.sh: unknown kind '$KIND' (h100, h200, x2, h200x2, cpu)"; exit 2 ;;
esac
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then GROUP=$1; shift; fi
COMMIT="" ROUNDS=5 BUDGET=550 SANITIZE=0 FILTER="" PAGODA_BIN=""
while [ $# -gt 0 ]; do
  case "$1" in
    --commit) COMMIT=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --sanitize) SANITIZE=1; shift ;;
    --filter) FILTER=$2; shift 2 ;;
    --pagoda) PAGODA_BIN=$(realpath "$2"); shift 2 ;;
    *) echo "run.sh: unknown option '$1'"; exit 2 ;;
  esac
done
case "$GPUS:$GROUP" in
  1:tests) STAGES="build tests" ;;
  1:kernels) STAGES="build kernels" ;;
  1:engine) STAGES="build engine spec" ;;
  1:serve) STAGES="build serve" ;;
  1:python) STAGES="build python" ;;
  1:hicache) STAGES="build hicache" ;;
  1:profile) STAGES="build profile" ;;
  1:amx) STAGES="build amx" ;;
  1:agree) STAGES="build agree" ;;
  1:dsa) STAGES="build dsa" ;;
  1:ab_kernels) STAGES="build abtests abkernels" ;;
  1:hybrid|0:hybrid) STAGES="build hybrid" ;;
  1:all) STAGES="build tests kernels engine spec serve" ;;
  2:tp) STAGES="build tp" ;;
  *) echo "run.sh: group '$GROUP' is not one for kind '$KIND'"; exit 2 ;;
esac
[ $SANITIZE = 1 ] && STAGES="$STAGES sanitize"
[ -n "$PAGODA_BIN" ] && STAGES=${STAGES/build /}

cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/pagoda_out}
W=/tmp/pagoda_run_${KIND}_$GROUP  # the run's working folder: logs, JSON lines, checkpoints' outputs
rm -rf "$W"; mkdir -p "$W" "$OUT"
TAG=${KIND}_$GROUP
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
start=$(date +%s)
say() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$SUMMARY"; }
finish() {
  python3 bench/device/record.py "$W" --kind "$KIND" --group "$GROUP" --commit "${COMMIT:-unknown}" \
    --stages "$STAGES" --out "$OUT/record_$TAG.json" >> "$SUMMARY" 2>&1 \
    && python3 bench/tables.py "$OUT/record_$TAG.json" > "$OUT/tables_$TAG.md" 2>> "$SUMMARY"
  say "record rc=$? -> record_$TAG.json, tables_$TAG.md"
  tar czf "$OUT/logs_$TAG.tgz" -C "$W" --exclude='*.safetensors' . 2>/dev/null
}
trap finish EXIT

[ -n "$COMMIT" ] || COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) threads" > "$W/cpu.txt"
if [ $GPUS -gt 0 ]; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit --format=csv,noheader \
    > "$W/gpu.csv" 2>&1
  python3 -c 'import torch; print(torch.__version__, torch.backends.cudnn.version())' > "$W/torch.txt" 2>&1
fi
say "kind $KIND group $GROUP commit $COMMIT stages: $STAGES"
say "$(head -1 "$W/gpu.csv" 2>/dev/null || cat "$W/cpu.txt")"

# Libraries the image lacks (PCRE2, ICU, SentencePiece, cpp-httplib, Highway): the carried .debs.
if [ $GPUS = 0 ]; then
  :  # a development host has them
elif compgen -G ".debs/*.deb" > /dev/null; then
  # shellcheck disable=SC1091
  source scripts/gpu_deps.sh env
elif ! pkg-config --exists libpcre2-8 2> /dev/null; then
  say "no .debs carried and no PCRE2 here: run scripts/gpu_deps.sh fetch and carry .debs"
  exit 1
fi
# FlashInfer and its two dependencies, carried as wheels.
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > "$W/pip.log" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=/tmp/b-device  # kept while the machine stays warm: a second call rebuilds nothing
P=${PAGODA_BIN:-$B/pagoda}
has() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }

ckpt() {  # ckpt LAYOUT [DTYPE] -> a random checkpoint of that layout (tools/make_checkpoint.py), bf16
  local dt=${2:-bf16} c=/tmp/ckpt-$1
  [ "$dt" = bf16 ] || c=$c-$dt
  [ -f "$c/config.json" ] || timeout 300 python3 tools/make_checkpoint.py --layout "$1" --dtype "$dt" \
    --seed 0 --out "$c" > "$W/ckpt_$1_$dt.log" 2>&1
  echo "$c"
}

# The hybrid group's sizes: the GPU's (issue 49's targets), or the CPU's (small enough for a
# 2-core host in a few minutes). The checkpoints are written beside the build.
if [ $GPUS = 0 ]; then
  HB=cpu HDT=f32 G_LAYOUT=gemma3-1b-narrow B_LAYOUT=bamba-small
  SWA_CTX=4096 SWA_CHUNK=1024 SWA_REQ=4 M_SHORT=1024 M_LONG=8192 PREFIX=2048 CHUNK=2048 SCAN_BATCH=16
else
  HB=cuda HDT=bf16 G_LAYOUT=gemma3-1b B_LAYOUT=bamba-1b
  SWA_CTX=32768 SWA_CHUNK=4096 SWA_REQ=12 M_SHORT=8192 M_LONG=65536 PREFIX=8192 CHUNK=8192 SCAN_BATCH=64
fi
HY_CKPT=""
if has hybrid; then
  for layout in $G_LAYOUT $B_LAYOUT; do
    ckpt "$layout" "$HDT" > /dev/null &
    HY_CKPT="$HY_CKPT $!"
  done
fi

FI_WARM=""
if has kernels && [ -n "${PYTHONPATH:-}" ]; then
  # FlashInfer compiles each kernel module on first use (about a minute each). A warm-up pass,
  # timings thrown away, one process per module (bench/cuda/cases.py --jit-groups) so they
  # compile in parallel, overlaps the build and the GPU tests; the timed rounds then find every
  # module built (the cache lives on this machine while it stays warm). bench/cuda/fi_jit.py gives
  # each module its own ninja log: the parallel warm-ups shared one and corrupted it, and the
  # round after them rebuilt modules (~280 s of the call at 1de75ef).
  g=0
  while read -r names; do
    g=$((g + 1))
    timeout 420 python3 bench/cuda/peers.py bench/cuda/cases.json "$W/fi_warmup_$g.jsonl" \
      --peers flashinfer --only "$names" > "$W/fi_warmup_$g.log" 2>&1 &
    FI_WARM="$FI_WARM $!"
  done < <(python3 bench/cuda/cases.py bench/cuda/cases.json --jit-groups)
fi

if has build; then
  t0=$(date +%s)
  # -U: pkg-config results are looked up again (a kept build folder may hold stale ones).
  cuda=ON; [ $GPUS = 0 ] && cuda=OFF
  cmake -S . -B $B -G Ninja -U '__pkg_config_checked_*' -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=$cuda \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DPAGODA_BUILD_BENCH=OFF > "$W/build.log" 2>&1
  # The GPU tests' binaries: every ctest -L gpu test named after a target of this build (the
  # others, the conformance runs, run the pagoda CLI).
  gpu_bins=$(comm -12 \
    <(ctest --test-dir $B -L gpu -N 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: //p' | sort -u) \
    <(ninja -C $B -t targets all 2>/dev/null | sed 's/:.*//' | sort -u) |
    { [ -n "$FILTER" ] && grep -E "$FILTER" || cat; } | tr '\n' ' ')
  targets=pagoda  # what every group runs; the GPU tests and the kernel benchmark where used
  has abkernels && targets="cuda_attention_tests"  # ab_kernels: the kernels alone, no CLI
  has tests && targets="$targets $gpu_bins"
  has kernels || has abkernels && targets="$targets pagoda_cuda_bench"
  has sanitize && targets="$targets cuda_attention_tests"
  has python && targets="$targets pagoda_python"
  has amx && targets="$targets model_tests engine_tests"
  # shellcheck disable=SC2086 # one word per target
  jobs=""; [ $GPUS = 0 ] && jobs=-j2  # a shared development host
  # shellcheck disable=SC2086 # one word per target
  timeout 480 ninja -C $B $jobs $targets >> "$W/build.log" 2>&1
  rc=$?
  echo "{\"rc\": $rc, \"seconds\": $(( $(date +%s) - t0 )), \"targets\": \"$targets\"}" > "$W/build.json"
  say "build rc=$rc ($(( $(date +%s) - t0 )) s): $targets"
  [ $rc = 0 ] || { grep -E "error|FAILED" "$W/build.log" | head -30 | tee -a "$SUMMARY"; exit 1; }
fi

if has tests; then
  t0=$(date +%s)
  PAGODA_REQUIRE_GPU=1 timeout 300 ctest --test-dir $B -L gpu ${FILTER:+-R "$FILTER"} -j3 \
    --timeout 280 --no-tests=error \
    --output-on-failure --output-junit "$W/ctest_gpu.xml" > "$W/ctest_gpu.log" 2>&1
  say "ctest -L gpu rc=$? ($(( $(date +%s) - t0 )) s): $(grep -E 'tests passed|tests failed' "$W/ctest_gpu.log")"
  cp $B/Testing/Temporary/LastTest.log "$W/ctest_gpu_full.log" 2>/dev/null
fi

# Seconds left of the budget, and a step's limit cut to them: the call reaches finish() (the
# record and logs) inside the device's limit.
left() { echo $(( BUDGET - ($(date +%s) - start) )); }
cap() { local l; l=$(left); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }

if has kernels; then
  if [ -n "$FI_WARM" ]; then
    for pid in $FI_WARM; do wait "$pid"; done
    say "FlashInfer warm-up done: $(cat "$W"/fi_warmup_*.jsonl 2>/dev/null | grep -c '"ms"') timed, $(cat "$W"/fi_warmup_*.jsonl 2>/dev/null | grep -c '"error"') refused"
  fi
  python3 bench/cuda/peers.py bench/cuda/cases.json "$W/ceilings.jsonl" --peers "" --ceilings \
    > "$W/ceilings.log" 2>&1
  peers=cudnn,flash
  [ -n "${PYTHONPATH:-}" ] && peers=$peers,flashinfer
  # Every round's steps are cut to what is left of the budget (left, cap), so the call always
  # reaches finish() inside the device's limit: at 14c5f24 a first round that started at 349 s
  # was killed at 600 s with everything unwritten.
  for k in $(seq 1 "$ROUNDS"); do
    if [ "$(left)" -lt 60 ]; then
      say "budget of $BUDGET s: $((k - 1)) of $ROUNDS rounds ran"
      break
    fi
    timeout "$(cap 120)" $B/tests/cuda/pagoda_cuda_bench bench/cuda/cases.json "$W/ours_r$k.jsonl" \
      > "$W/ours_r$k.log" 2>&1
    rc_o=$?
    # (the H100 run at 7f42199 took 176 s for 41 peer rows and was cut at 200 s before the
    # fp8-KV and MLA rows: every case's line in peers_r*.log carries its seconds)
    timeout "$(cap 330)" python3 bench/cuda/peers.py bench/cuda/cases.json "$W/peers_r$k.jsonl" \
      --peers $peers > "$W/peers_r$k.log" 2>&1
    rc_p=$?
    say "kernel round $k: ours rc=$rc_o ($(wc -l < "$W/ours_r$k.jsonl") cases), peers rc=$rc_p ($(wc -l < "$W/peers_r$k.jsonl") rows)"
  done
fi

# Kernel-option variants against the defaults (issue 53): NAME|CASES|OPTIONS, one a line. CASES:
# the pagoda_cuda_bench name filter (comma-separated substrings); OPTIONS: its kernel options.
# The base (every option at its default) runs the union of the cases in each round. Kept: the
# overlap schedule off (fp8 K/V then takes the mma.sync kernel; 16-bit D 128 tile by tile), so
# every record shows what the sm90 fp8 path and the overlap schedule gain. (The prepared
# variants measured at dab988d: fp8 K/V on the sm90 kernel 3.36-3.80x, now the default; DQK 192
# at 64-key tiles tile by tile 1.027-1.038x, now the default; on the overlap schedule
# 0.995-1.003x, and per-block unit lists 0.93-1.01x, both deleted.)
AB_VARIANTS="no_overlap|fp8kv_,prefill_causal_b4_s4096,prefill_causal_b16_s1024|--kernel-option sm90_overlap=0"

# The sm90 prefill's GPU tests (the ctest -L gpu run of the tests group has every other one).
AB_TESTS="CudaExtend.Sm90*:CudaExtend.CausalWithPrefix:CudaExtend.NonCausalWindowCapSinksFp8"
AB_TESTS="$AB_TESTS:CudaExtend.PersistentUnitsAcrossBlocks:CudaExtend.MlaPrefill*"

if has abtests; then
  t0=$(date +%s)
  PAGODA_REQUIRE_GPU=1 timeout 240 $B/tests/cuda/cuda_attention_tests \
    --gtest_filter="$AB_TESTS" --gtest_output="json:$W/ab_tests.json" \
    > "$W/ab_tests.log" 2>&1
  say "variant tests rc=$? ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED)' "$W/ab_tests.log" | tr '\n' ' ')"
  san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null)
  for tool in memcheck racecheck; do
    PAGODA_REQUIRE_GPU=1 timeout 100 "$san" --tool $tool --error-exitcode 9 \
      $B/tests/cuda/cuda_attention_tests --gtest_filter='CudaExtend.Sm90SanitizerSmall' \
      > "$W/sanitize_ab_$tool.log" 2>&1
    say "compute-sanitizer $tool (CudaExtend.Sm90SanitizerSmall) rc=$? $(grep -E '(ERROR|RACECHECK) SUMMARY' "$W/sanitize_ab_$tool.log")"
  done
fi

if has abkernels; then
  echo "$AB_VARIANTS" > "$W/ab_variants.txt"
  all=$(echo "$AB_VARIANTS" | cut -d'|' -f2 | tr '\n' ',' | sed 's/,$//')
  ab() {  # ab NAME CASES OPTIONS... -> ab_NAME_r$k.jsonl
    local name=$1 cases=$2; shift 2
    timeout "$(cap 150)" $B/tests/cuda/pagoda_cuda_bench bench/cuda/cases.json "$W/ab_${name}_r$k.jsonl" \
      "$cases" "$@" > "$W/ab_${name}_r$k.log" 2>&1
    echo "$name rc=$? ($(wc -l < "$W/ab_${name}_r$k.jsonl") cases)"
  }
  for k in $(seq 1 "$ROUNDS"); do
    if [ "$(left)" -lt 60 ]; then
      say "budget of $BUDGET s: $((k - 1)) of $ROUNDS A/B rounds ran"
      break
    fi
    # Odd rounds: base first, then the variants; even rounds: the variants reversed, then base.
    order=$(echo "$AB_VARIANTS" | cut -d'|' -f1)
    [ $((k % 2)) = 0 ] && order=$(echo "$order" | tac)
    line=""
    add() { line="${line:+$line; }$1"; }
    [ $((k % 2)) = 1 ] && add "$(ab base "$all")"
    for name in $order; do
      spec=$(echo "$AB_VARIANTS" | grep "^$name|")
      # shellcheck disable=SC2046 # the options split into words
      add "$(ab "$name" "$(echo "$spec" | cut -d'|' -f2)" $(echo "$spec" | cut -d'|' -f3))"
    done
    [ $((k % 2)) = 0 ] && add "$(ab base "$all")"
    say "A/B round $k: $line"
  done
fi

if has engine; then
  t0=$(date +%s)
  timeout 420 python3 bench/engine_real.py --pagoda $P --out "$W/engine" --layouts 1b,8b \
    --single-only 8b > "$W/engine.log" 2>&1
  say "engine_real rc=$? ($(( $(date +%s) - t0 )) s)"
fi

if has agree; then
  # Issues 49 / 50: first tokens of pagoda (bf16, cuda backend) vs transformers fp32 on the GPU,
  # the DeepSeek MLA layouts and the real-size hybrid ones, 20 prompts of 300 ids each.
  mkdir -p "$W/agree"
  timeout "$(cap 500)" python3 bench/agreement_vs_transformers.py --pagoda $P --out "$W/agree" \
    --device cuda --length 300 \
    --layouts deepseek-v2-tiny,deepseek-v3-tiny,deepseek-v2-lite-narrow,gemma3-1b,bamba-1b,1b \
    > "$W/agree/result.json" 2> "$W/agree.log"
  say "agreement vs transformers rc=$? $(grep '^| ' "$W/agree.log" | tail -n 5 | tr '\n' ' ')"
  rm -rf "$W"/agree/*/  # the checkpoints, not into the logs
fi

if has spec; then
  mkdir -p "$W/spec"
  C=$(ckpt 1b)
  # Each run is an A/B in one process: the same workload without, then with speculation.
  spec() {  # spec NAME ARGS...
    local name=$1; shift
    timeout 200 $P bench --model "$C" --backend cuda --json "$@" > "$W/spec/$name.json" \
      2> "$W/spec/$name.err"
    say "spec $name rc=$?"
  }
  D3="--spec draft --spec-steps 3 --spec-topk 1 --spec-draft-tokens 4"
  spec self_draft $D3 --workload random --requests 8 --input-len 256 --output-len 256 --max-running 1
  spec self_tree --spec draft --spec-steps 3 --spec-topk 4 --spec-draft-tokens 8 \
    --workload random --requests 8 --input-len 256 --output-len 256 --max-running 1
  spec ngram_random --spec ngram --spec-steps 4 --spec-topk 1 --spec-draft-tokens 5 \
    --workload random --requests 8 --input-len 512 --output-len 256 --max-running 1
  if [ ! -f /tmp/ckpt-1b-copy/config.json ]; then
    timeout 300 python3 tools/make_copy_model.py --src "$C" --out /tmp/ckpt-1b-copy \
      > "$W/spec/make_copy.log" 2>&1
  fi
  C=/tmp/ckpt-1b-copy
  spec copy_chain --spec ngram --spec-steps 6 --spec-topk 1 --spec-draft-tokens 7 \
    --workload repeat --requests 8 --input-len 512 --output-len 256 --max-running 1
  spec copy_b16 --spec ngram --spec-steps 6 --spec-topk 1 --spec-draft-tokens 7 \
    --workload repeat --requests 32 --input-len 512 --output-len 256 --max-running 16
fi

if has serve; then
  C=$(ckpt 1b)
  # The server and `pagoda bench` with the same engine settings, at concurrency 1, 16 and 64.
  timeout 400 python3 bench/serve_bench.py --pagoda $P --model "$C" --out "$W/serve" \
    --concurrency 1,16,64 --num-prompts 0 --input-median 256 --output-median 128 \
    --max-input 2048 --max-output 512 --pool-tokens 262144 --max-running 64 \
    --compare-input-len 512 --compare-output-len 256 --compare-requests 512 --compare-repeats 3 \
    > "$W/serve_bench.log" 2>&1
  say "serve_bench rc=$?"
fi

if has hicache; then
  mkdir -p "$W/hicache"
  # The pinned host -> device copy bandwidth the load-back is held against (torch, 1 GiB, 10 copies).
  python3 -c '
import json, torch
n = 1 << 30
h = torch.empty(n, dtype=torch.uint8, pin_memory=True); d = torch.empty(n, dtype=torch.uint8, device="cuda")
for _ in range(2): d.copy_(h, non_blocking=True)
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ms = []
for _ in range(10):
    a.record(); d.copy_(h, non_blocking=True); b.record(); b.synchronize(); ms.append(a.elapsed_time(b))
ms.sort(); print(json.dumps({"h2d_pinned_gbps": n / (ms[5] * 1e-3) / 1e9, "samples_ms": ms}))' \
    > "$W/hicache/pinned_copy.json" 2> "$W/hicache/pinned_copy.err"
  say "pinned copy rc=$? $(cat "$W/hicache/pinned_copy.json")"
  # doc (first: the shape the host tier is for): conversations x 4 turns of 2,048-token user
  # messages (documents) over a 256-token system prompt, 32-token answers, 8k-token prefill
  # chunks; 1B: 64 conversations on a 128k-token device pool, 8B: 32 on 64k (its host tier's
  # pinned memory, 5x the pool, is 42 GB). Live KV is 4.2x the pool, so most of a turn's history
  # is evicted from the device before the conversation's next turn, while the pool still holds
  # ~15 (8B: ~7) conversations at their longest (a smaller pool makes the batch, not the prefill,
  # the bottleneck, and no tier helps there). Prefill dominates the device-only run: it
  # recomputes ~2.6x the prompt tokens the host tier run computes.
  # chat: 64 conversations x 6 turns over a 1,024-token system prompt, short questions,
  # 128-token answers: about 65k live KV tokens against a 16k-token device pool (the record has
  # live_kv_over_pool); the shared prompt stays on the device, so most of a turn's prefix hits
  # there too, and decode dominates.
  MT="--workload multiturn --max-running 32 --page-size 16 --backend cuda --json"
  CHAT="--pool-tokens 16384 --conversations 64 --turns 6 --system-len 1024 --max-new-tokens 128"
  for shape in doc chat; do  # both layouts' doc runs before any chat run
    for layout in 1b 8b; do
      C=$(ckpt $layout)
      need=150; [ $layout = 1b ] && need=60  # a run's budget: an 8B process loads ~60 s of weights
      DOC="--chunk-size 8192 --turns 4 --system-len 256 --user-len 2048 --max-new-tokens 32"
      [ $layout = 1b ] && DOC="$DOC --pool-tokens 131072 --conversations 64" ||
        DOC="$DOC --pool-tokens 65536 --conversations 32"
      [ $shape = chat ] && wl=$CHAT || wl=$DOC
      # The load-back probe before the doc runs: the TTFT of new tokens on an 8k prefix that is
      # cold, on the device or loaded back from the host tier (16 new tokens: the copy alone).
      exts="16 512"; [ $layout = 8b ] && exts=512
      for e in $exts; do
        [ $shape = doc ] && [ "$(left)" -ge $need ] || continue
        timeout 200 $P bench --model "$C" --backend cuda --workload loadback --input-len 8192 \
          --user-len $e --requests 5 --pool-tokens 65536 --hicache-ratio 2 --json \
          > "$W/hicache/loadback_${layout}_e$e.json" 2> "$W/hicache/loadback_${layout}_e$e.err"
        say "hicache loadback $layout +$e rc=$? $(tail -c 300 "$W/hicache/loadback_${layout}_e$e.err")"
      done
      # storage (1B chat only: ~2 GB of pages on the device host's disk): a host tier of 1x the
      # pool over a file store, so most pages evicted from the host tier are read back from disk.
      runs="device host"; [ $shape = chat ] && [ $layout = 1b ] && runs="device host storage"
      for run in $runs; do
        extra=""
        tag=$layout; [ $shape = doc ] && tag=${layout}-doc
        ratio=8; [ $shape = doc ] && ratio=5
        [ $run = host ] && extra="--hicache-ratio $ratio --hicache-write-policy write_through"
        [ $run = storage ] && rm -rf "$W/hicache/store" && mkdir -p "$W/hicache/store" &&
          extra="--hicache-ratio 1 --hicache-write-policy write_through --hicache-storage file:$W/hicache/store"
        if [ "$(left)" -lt $need ]; then say "hicache $tag $run skipped: $(left) s of the budget left"; continue; fi
        # shellcheck disable=SC2086 # one word per flag
        timeout 200 $P bench --model "$C" $MT $wl $extra > "$W/hicache/${tag}_$run.json" \
          2> "$W/hicache/${tag}_$run.err"
        say "hicache $tag $run rc=$?"
        [ $run = storage ] && rm -rf "$W/hicache/store"  # not into the logs
      done
    done
  done
fi

if has python; then
  mkdir -p "$W/python"
  if [ -f $B/python/pagoda/__init__.py ]; then
    PP=$B/python${PYTHONPATH:+:$PYTHONPATH}
    PAGODA_REQUIRE_GPU=1 PYTHONPATH=$PP timeout 240 python3 -m pytest -q -rs -p no:cacheprovider \
      tests/unit/python/test_flashinfer_torch.py > "$W/python/pytest_torch.log" 2>&1
    say "python torch tests rc=$? $(tail -1 "$W/python/pytest_torch.log")"
    PYTHONPATH=$PP timeout 420 python3 bench/python_vs_flashinfer.py --pagoda $P \
      --json "$W/python/vs_flashinfer.jsonl" > "$W/python/vs_flashinfer.log" 2>&1
    say "python_vs_flashinfer rc=$?"
    PYTHONPATH=$PP timeout 240 python3 bench/llm_vs_bench.py --pagoda $P --model "$(ckpt 1b)" \
      --backend cuda --rounds 3 --json "$W/python/llm_vs_bench.json" > "$W/python/llm_vs_bench.log" 2>&1
    say "llm_vs_bench rc=$? $(tail -1 "$W/python/llm_vs_bench.log")"
  else
    say "no Python package was built (nanobind or Python headers missing: see build.log)"
  fi
fi

if has tp; then
  mkdir -p "$W/tp"
  nvidia-smi topo -m > "$W/tp/topo.txt" 2>&1
  # Decode at batch 1 and 64, tp 1 then tp 2 (the same workload, one process each).
  for layout in 1b 8b; do
    C=$(ckpt $layout)
    for bs in 1 64; do
      for tp in 1 2; do
        timeout 280 $P bench --model "$C" --backend cuda --tp $tp --json --requests $bs \
          --max-running $bs --input-len 128 --output-len 128 --pool-tokens 65536 --chunk-size 0 \
          --page-size 16 > "$W/tp/bench_${layout}_b${bs}_tp$tp.json" 2> "$W/tp/bench_${layout}_b${bs}_tp$tp.err"
        say "tp bench $layout b$bs tp$tp rc=$?"
      done
    done
  done
  # Greedy outputs of tp 2 == tp 1 (f32 weights: no reduction-order ties) on 20 random prompts.
  python3 -c '
import random, sys
r = random.Random(1313)
for i in range(20):
    print(",".join(str(r.randrange(100000)) for _ in range(r.randrange(16, 300))))' > "$W/tp/prompts.txt"
  for tp in 1 2; do
    timeout 200 $P generate --model "$(ckpt 1b)" --backend cuda --dtype f32 --tp $tp \
      --batch-file "$W/tp/prompts.txt" --max-new-tokens 24 --ignore-eos \
      > "$W/tp/gen_f32_tp$tp.jsonl" 2> "$W/tp/gen_f32_tp$tp.err"
    say "tp generate f32 tp$tp rc=$?"
  done
fi
if has profile; then
  mkdir -p "$W/profile"
  python3 bench/cuda/peers.py bench/cuda/cases.json "$W/ceilings.jsonl" --peers "" --ceilings \
    > "$W/ceilings.log" 2>&1
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null \
    | head -1)
  "$NCU" --version > "$W/profile/ncu_version.txt" 2>&1
  say "ncu: ${NCU:-none} $(tail -1 "$W/profile/ncu_version.txt")"
  STEPS=4  # decode steps summarised (the last ones of the profiled run)
  PROFILE_AB="min_chunk512|--kernel-option=decode_min_chunk=512 min_chunk256|--kernel-option=decode_min_chunk=256"
  [ -x "$NCU" ] || { say "no ncu on this machine: nothing profiled"; exit 1; }
  for run in 1b:1 1b:64 8b:1; do
    layout=${run%:*} bs=${run#*:} tag=${run/:/_b}
    need=150  # the timed bench and the ncu run; a checkpoint to write first takes longer (8B)
    [ -f "/tmp/ckpt-$layout/config.json" ] || need=$([ "$layout" = 1b ] && echo 180 || echo 330)
    if [ "$(left)" -lt "$need" ]; then say "profile $tag skipped: $(left) s of the budget left"; continue; fi
    C=$(ckpt "$layout")
    L=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' \
      "$C/config.json")
    common=(--model "$C" --backend cuda --json --requests "$bs" --max-running "$bs" --pool-tokens 65536
            --chunk-size 0 --page-size 16)
    # The step as bench/engine_real.py measures it: 128 in / 128 out, mean context 192.
    timeout "$(cap 120)" $P bench "${common[@]}" --input-len 128 --output-len 128 \
      > "$W/profile/$tag.bench.json" 2> "$W/profile/$tag.bench.err"
    # 1B batch 1: the same step with each PROFILE_AB option and again with none, alternating
    # twice (tag.ab_<round>_<name>.json; name "base" = no option): the decode plan's split-KV
    # floor (a 192-token context splits into 64-key chunks and a merge per layer). ~60 s; not
    # at 8B, whose every run loads ~60 s of weights.
    if [ "$tag" = 1b_b1 ]; then
      for k in 1 2; do
        for spec in "base|" $PROFILE_AB; do
          name=${spec%%|*} opts=${spec#*|}
          # shellcheck disable=SC2086 # the options split into words
          timeout "$(cap 120)" $P bench "${common[@]}" --input-len 128 --output-len 128 $opts \
            > "$W/profile/$tag.ab_${k}_$name.json" 2> /dev/null
        done
      done
    fi
    graphs=$(python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["cuda_graphs"])' \
      "$W/profile/$tag.bench.json" 2> /dev/null || echo 0)
    # Skip a lower bound of the kernels before the first decode step: the graph capture's eager
    # forwards (model/llama_worker.cpp capture_step: one, then two per captured batch size) at 7
    # kernels per layer (a decode layer launches 8 or more). Then every kernel to the end of the
    # run is profiled; the summary takes the last $STEPS forwards (all decode at the full batch:
    # every request has the same lengths, one prefill batch takes them all (64 x 192 tokens is
    # over the default 8,192 of --max-prefill-tokens) and they decode together to the end).
    skip=$(( (1 + 2 * graphs) * 7 * L ))
    t0=$(date +%s)
    timeout "$(cap 240)" "$NCU" --clock-control none --cache-control none --graph-profiling node \
      --launch-skip "$skip" --print-units base --print-kernel-base demangled --csv \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
      $P bench "${common[@]}" --input-len 192 --output-len $((STEPS + 3)) --max-prefill-tokens 16384 \
      > "$W/profile/$tag.ncu.csv" 2> "$W/profile/$tag.ncu.err"
    rc=$?
    echo "{\"layout\": \"$layout\", \"batch\": $bs, \"steps\": $STEPS, \"launch_skip\": $skip, \"input_len\": 192, \"output_len\": $((STEPS + 3)), \"timed_input_len\": 128, \"timed_output_len\": 128, \"ncu_rc\": $rc, \"ncu_seconds\": $(( $(date +%s) - t0 ))}" \
      > "$W/profile/$tag.meta.json"
    say "profile $tag: step $(grep -o '"decode_step_ms":[0-9.]*' "$W/profile/$tag.bench.json"), ncu rc=$rc ($(( $(date +%s) - t0 )) s, skip $skip, $(grep -c '^"' "$W/profile/$tag.ncu.csv") CSV rows)"
  done
fi
if has amx; then
  mkdir -p "$W/amx"
  grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(amx|avx512)' | sort | tr '\n' ' ' \
    > "$W/amx/cpu_flags.txt"
  echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) threads" > "$W/amx/cpu_model.txt"
  say "CPU: $(cat "$W/amx/cpu_model.txt"); $(cat "$W/amx/cpu_flags.txt")"
  timeout "$(cap 120)" $B/tests/unit/model/model_tests --gtest_filter='CpuGemm*:*ModelForward*' \
    --gtest_output="json:$W/amx/model_tests.json" > "$W/amx/model_tests.log" 2>&1
  say "model_tests (CpuGemm, forward) rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$W/amx/model_tests.log" | tr '\n' ' ')"
  timeout "$(cap 120)" $B/tests/unit/engine/engine_tests --gtest_filter='*EngineCpuGemm*:EngineArgs.*' \
    --gtest_output="json:$W/amx/engine_tests.json" > "$W/amx/engine_tests.log" 2>&1
  say "engine_tests (EngineCpuGemm) rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$W/amx/engine_tests.log" | tr '\n' ' ')"
  timeout "$(cap 120)" $P conformance --backends amx --seed 1234 --output "$W/amx/conformance.md" \
    > "$W/amx/conformance.log" 2>&1
  say "conformance amx rc=$? $(tail -1 "$W/amx/conformance.log")"
  # The model first (issue 51's end-to-end target), its rows cut by its own budget (a row that
  # would start later is recorded as skipped): 2 and all threads, 1 and 8 requests, pagoda's own
  # AMX GEMMs (--cpu-gemm amx, what auto picks on AMX CPUs) and oneDNN's.
  if [ "$(left)" -gt 150 ]; then
    mb=$(cap 260)
    timeout "$mb" python3 bench/cpu_model_vs_torch.py --pagoda $P --model "$(ckpt 1b)" \
      --out "$W/amx" --threads 2 "$(nproc)" --requests 1 8 --modes amx onednn \
      --budget $(( mb - 60 )) > "$W/amx/cpu_model_vs_torch.log" 2>&1
    say "cpu_model_vs_torch rc=$?"
  else
    say "cpu_model_vs_torch skipped: $(left) s of the budget left"
  fi
  timeout "$(cap 200)" python3 bench/cpu_vs_torch.py --pagoda $P --out "$W/amx" --threads 2 "$(nproc)" \
    --amx --no-ab > "$W/amx/cpu_vs_torch.log" 2>&1
  say "cpu_vs_torch rc=$?"
fi

if has hybrid; then
  # Issue 49's hybrid benchmarks; every run's JSON goes to $W/hybrid/<name>.json (record.py:
  # "hybrid"). A run starts only with enough of the budget left; the record holds what ran.
  H=$W/hybrid
  mkdir -p "$H"
  for pid in $HY_CKPT; do wait "$pid"; done
  G=$(ckpt $G_LAYOUT $HDT) M=$(ckpt $B_LAYOUT $HDT)
  say "checkpoints: $(ls "$G" "$M" 2>&1 | grep -c safetensors) written ($G, $M)"
  hy() {  # hy NAME NEED_S ARGS...: one pagoda run, its stdout (JSON) to $H/NAME.json
    local name=$1 need=$2; shift 2
    if [ "$(left)" -lt "$need" ]; then say "hybrid $name skipped: $(left) s of the budget left"; return; fi
    timeout "$(cap 240)" $P "$@" > "$H/$name.json" 2> "$H/$name.err"
    local rc=$?
    # A refused or failed run keeps its reason in the record.
    [ $rc = 0 ] || python3 -c 'import json, sys; print(json.dumps({"error": sys.argv[1][-400:], "rc": int(sys.argv[2])}))' \
      "$(grep -v '^\[' "$H/$name.err" | tail -2 | tr '\r\n' '  ')" $rc >> "$H/$name.json"
    say "hybrid $name rc=$rc $(grep -o '"\(decode_step_ms\|ms\|ttft_by_turn_ms\|error\)":[^,]*' "$H/$name.json" | head -1)"
  }
  # 1. Gemma-3 layout, one request of SWA_CTX tokens (prompt + 128 out), radix cache off (random
  #    prompts share nothing): the window pool (on) vs one full pool (off), the same pool tokens.
  #    Chunks of SWA_CHUNK: a prefilling request holds a chunk + the window in the SWA pool.
  GB=(bench --model "$G" --backend $HB --json --no-radix --page-size 16 --chunk-size $SWA_CHUNK
      --max-context-len $SWA_CTX)
  for mode in off on; do
    hy swa_step_$mode 60 "${GB[@]}" --swa-pool $mode --requests 1 --max-running 1 \
      --input-len $((SWA_CTX - 128)) --output-len 128 --pool-tokens $((SWA_CTX + 1024))
  done
  # 2. The same byte budget for both: what 2.5 such requests take in one full pool (the off run's
  #    bytes per token); SWA_REQ requests queued, the most that decode together is what fits.
  budget=$(python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(int(2.5 * int(sys.argv[2]) * j["kv_bytes"] / ((j["pages_total"] + 1) * j["page_size"])))' \
    "$H/swa_step_off.json" $SWA_CTX 2> /dev/null)
  if [ -n "$budget" ]; then
    for mode in off on; do
      hy swa_fit_$mode 90 "${GB[@]}" --swa-pool $mode --swa-full-tokens-ratio 0.1 \
        --kv-cache-memory "$budget" --requests $SWA_REQ --max-running $SWA_REQ \
        --input-len $((SWA_CTX - 32)) --output-len 32
    done
  fi
  # 3. Bamba: the decode step (batch 1, 256 steps: 64 were too few on a shared 2-core host) at
  #    M_SHORT and M_LONG tokens of context, and the
  #    attention layers' decode kernel alone at both lengths (the model's attention shape).
  MB=(bench --model "$M" --backend $HB --json --page-size 16 --chunk-size $CHUNK --requests 1
      --max-running 1 --pool-tokens $((M_LONG + 2048)) --max-context-len $M_LONG)
  for ctx in $M_SHORT $M_LONG; do
    hy mamba_step_$ctx 60 "${MB[@]}" --input-len $((ctx - 256)) --output-len 256
  done
  read -r hq hkv hd <<< "$(python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c["num_attention_heads"], c["num_key_value_heads"], c["hidden_size"] // c["num_attention_heads"])' "$M/config.json")"
  read -r mh mp mn mg <<< "$(python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c["mamba_n_heads"], c["mamba_d_head"], c["mamba_d_state"], c["mamba_n_groups"])' "$M/config.json")"
  kvdt=bf16; [ $HDT = f32 ] && kvdt=f32
  for ctx in $M_SHORT $M_LONG; do
    hy attn_decode_$ctx 30 kernels --backend $HB --op decode --batch 1 --kv-len $ctx --q-heads $hq \
      --kv-heads $hkv --head-dim $hd --kv-dtype $kvdt --q-dtype $kvdt --iters 50 --json
  done
  # 4. The Mamba2 scan of the model's shape: decode (SCAN_BATCH sequences, one token) and a
  #    prefill of PREFIX tokens, against the copy bandwidth measured in the same process.
  SC=(kernels --backend $HB --q-heads $mh --head-dim $mp --state-size $mn --groups $mg --conv-kernel 4 --json)
  hy scan_decode 30 "${SC[@]}" --op linear-decode --batch $SCAN_BATCH --iters 20
  hy scan_prefill 60 "${SC[@]}" --op linear-prefill --batch 1 --kv-len $PREFIX --iters 5 --warmup 1
  # 5. A prefix hit restoring the state: one conversation of two turns over a PREFIX-token
  #    system prompt (64-token question, 16-token answer); turn 2's TTFT with the radix cache
  #    (its turn-1 state snapshot restored) vs without (turn 2 prefilled cold).
  TB=(bench --model "$M" --backend $HB --json --workload multiturn --conversations 1 --turns 2
      --system-len $PREFIX --user-len 64 --max-new-tokens 16 --page-size 16 --chunk-size $CHUNK
      --pool-tokens $((4 * PREFIX)) --max-running 1)
  hy ttft_cached 60 "${TB[@]}"
  hy ttft_cold 60 "${TB[@]}" --no-radix
  echo "{\"backend\": \"$HB\", \"dtype\": \"$HDT\", \"gemma_layout\": \"$G_LAYOUT\", \"bamba_layout\": \"$B_LAYOUT\", \"swa_ctx\": $SWA_CTX, \"swa_chunk\": $SWA_CHUNK, \"swa_requests\": $SWA_REQ, \"swa_budget_bytes\": ${budget:-0}, \"mamba_short\": $M_SHORT, \"mamba_long\": $M_LONG, \"prefix\": $PREFIX, \"attention_layers\": $(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["attn_layer_indices"]))' "$M/config.json")}" \
    > "$H/meta.json"
fi

if has dsa; then
  # Issue 50's DSA decode step; every run's JSON goes to $W/dsa/<name>.json (record.py: "dsa").
  mkdir -p "$W/dsa"
  for shape in "b16_l32768_h128 16 32768 128" "b16_l131072_h128 16 131072 128" \
               "b16_l131072_h16 16 131072 16"; do
    read -r name bs len hq <<< "$shape"
    if [ "$(left)" -lt 60 ]; then say "dsa $name skipped: $(left) s of the budget left"; continue; fi
    timeout "$(cap 150)" $P kernels --backend cuda --op dsa-decode --batch $bs --kv-len $len \
      --q-heads $hq --page-size 64 --kv-dtype bf16 --iters 10 --json \
      > "$W/dsa/$name.json" 2> "$W/dsa/$name.err"
    say "dsa $name rc=$? $(grep -o '"dsa_over_dense":[^,]*' "$W/dsa/$name.json")"
  done
  if [ "$(left)" -ge 240 ]; then  # the checkpoint (2.6 B parameters, numpy) takes most of it
    t0=$(date +%s)
    timeout "$(cap 500)" python3 bench/engine_real.py --pagoda $P --out "$W/engine" \
      --layouts deepseek-v2-lite --skip-peer > "$W/engine.log" 2>&1
    say "engine_real deepseek-v2-lite rc=$? ($(( $(date +%s) - t0 )) s)"
  else
    say "engine_real deepseek-v2-lite skipped: $(left) s of the budget left"
  fi
fi

if has sanitize; then
  san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null)
  for tool in memcheck racecheck; do
    PAGODA_REQUIRE_GPU=1 timeout 150 "$san" --tool $tool --error-exitcode 9 \
      $B/tests/cuda/cuda_attention_tests \
      --gtest_filter='CudaDecode.Bf16Page16Skewed:CudaExtend.CausalWithPrefix:CudaExtend.TreeMaskVerify:MlaDecode.SanitizerSmall' \
      > "$W/sanitize_$tool.log" 2>&1
    say "compute-sanitizer $tool rc=$? $(grep -E '(ERROR|RACECHECK) SUMMARY' "$W/sanitize_$tool.log")"
  done
fi
say "done"
