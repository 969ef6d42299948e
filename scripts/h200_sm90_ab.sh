#!/usr/bin/env bash
# One device call: this tree's Hopper kernels against other trees on the same machine (only a
# same-call A/B shows changes of a few percent: H200s differ by that much between calls).
#   TREES="name:dir ..." — the other trees, each an untracked directory of this checkout (so the
#     device copy carries it), e.g. `mkdir var_base && git archive <commit> | tar -x -C var_base`.
#   VARIANTS="name:VAR=value ..." — this tree's build again under an environment setting
#     (e.g. notma:PAGODA_SM90_TMA=0), timed like another tree; "name@tree:VAR=value" runs the
#     build of TREES entry `tree` instead; commas separate several settings (A=1,B=0).
#   ROUNDS (2) — interleaved rounds over the trees.
#   TEST_FILTER — a gtest filter for this tree's cuda_attention_tests (default: all).
#   BENCH_CASES ("prefill extend tree") — pagoda_cuda_bench's case filters; empty: MLA decode only.
# Builds every tree (sm_90a, in parallel); runs this tree's cuda_attention_tests
# (PAGODA_REQUIRE_GPU=1) and compute-sanitizer memcheck on SAN_TESTS; then per round and tree
# pagoda_cuda_bench's prefill / extend / verify / MLA-prefill cases and `pagoda kernels` on the
# MLA decode shapes (MLA_SHAPES; set but empty: none). Prints per case the median over rounds
# for each tree and its ratio to the first other tree. COMMIT names this tree's commit.
# Results: $OUT/sm90_ab.tgz (device_lib.sh).
set -uo pipefail
# shellcheck disable=SC1091
source "$(dirname "$0")/device_lib.sh"
device_setup sm90_ab
exec > >(tee -a "$R/summary.txt") 2>&1
echo "trees: main:. ${TREES:-}; SM clock max $(nvidia-smi --query-gpu=clocks.max.sm \
  --format=csv,noheader)" | tee -a "$R/gpu.txt"
names=(main)
declare -A bin_of env_of
bin_of[main]=main
env_of[main]=
# Wait on the builds by pid: a bare `wait` also waits for the tee above, which never ends.
device_build_tree main . 10 pagoda pagoda_cuda_bench cuda_attention_tests &
TREE_PIDS=$!
device_build_trees 6 pagoda pagoda_cuda_bench
for t in ${TREES:-}; do
  names+=("${t%%:*}")
  bin_of[${t%%:*}]=${t%%:*}
  env_of[${t%%:*}]=
done
# shellcheck disable=SC2086
wait $TREE_PIDS
for v in ${VARIANTS:-}; do
  n=${v%%:*}
  names+=("${n%%@*}")
  if [ "$n" != "${n#*@}" ]; then bin_of[${n%%@*}]=${n#*@}; else bin_of[$n]=main; fi
  e=${v#*:}
  env_of[${n%%@*}]=${e//,/ }
done
M=/tmp/b-main/tests/cuda
SECONDS=0
PAGODA_REQUIRE_GPU=1 timeout 200 $M/cuda_attention_tests ${TEST_FILTER:+--gtest_filter=$TEST_FILTER} \
  > "$R/tests.log" 2>&1
echo "tests rc=$? ${SECONDS}s $(grep -E '^\[  (PASSED|FAILED)' "$R/tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED|Failure|Expected|Which is" "$R/tests.log" | head -20
SAN_TESTS=${SAN_TESTS:-CudaExtend.MlaPrefillDims192x128:CudaExtend.CausalWithPrefix:CudaExtend.TreeMaskVerify:MlaDecode.SanitizerSmall}
if [ "$SAN_TESTS" != none ]; then
  SECONDS=0
  echo "$(device_sanitize memcheck 200 "$R/memcheck.log" $M/cuda_attention_tests \
    --gtest_filter="$SAN_TESTS") ${SECONDS}s"
fi
IFS=';' read -r -a mla <<< "${MLA_SHAPES-64 16 4096 64 bf16;8 128 8192 64 bf16;128 128 4096 64 bf16;1 128 32768 64 bf16;8 128 8192 64 fp8_e4m3}"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for n in "${names[@]}"; do
    b=/tmp/b-${bin_of[$n]}
    for c in ${BENCH_CASES-prefill extend tree}; do
      # shellcheck disable=SC2086
      env ${env_of[$n]} timeout 90 "$b/tests/cuda/pagoda_cuda_bench" "$R/${n}_${c}_$r.jsonl" "$c" \
        > /dev/null || echo "bench $n $c rc=$?"
    done
    for shape in "${mla[@]}"; do
      # shellcheck disable=SC2086
      set -- $shape
      env ${env_of[$n]} timeout 60 "$b/pagoda" kernels --backend cuda --op decode --batch "$1" --q-heads "$2" \
        --kv-len "$3" --page-size "$4" --kv-dtype "$5" --kv-heads 1 --head-dim 576 \
        --head-dim-v 512 --json --iters 30 2>> "$R/kernels.err" |
        sed "s/^{/{\"case\": \"mla_decode_b$1_h$2_l$3_p$4_$5\", /" >> "$R/${n}_mladec_$r.jsonl" ||
        echo "kernels $n $shape rc=$?"
    done
  done
done
python3 - "$R" "${names[@]}" <<'EOF' | tee "$R/ab.txt"
import glob, json, os, re, statistics, sys
root, names = sys.argv[1], sys.argv[2:]
t = {}
# <name>_<case filter>_<round>.jsonl, by the longest name that fits (a tree "base" must not
# take the files of a variant "base_snake").
for f in glob.glob(f"{root}/*.jsonl"):
    base = os.path.basename(f)
    fits = [n for n in names if re.match(re.escape(n) + r"_.+_\d+\.jsonl$", base)]
    if not fits:
        continue
    name = max(fits, key=len)
    for line in open(f):
        try:
            j = json.loads(line)
        except ValueError:
            continue
        ms = j.get("ms", j.get("median_ms", j.get("time_ms")))
        if "case" in j and ms is not None:
            t.setdefault(j["case"], {}).setdefault(name, []).append(float(ms))
print("case".ljust(40) + "".join(n.rjust(12) for n in names) + "  main/" + (names[1] if len(names) > 1 else ""))
for c in sorted(t):
    med = {n: statistics.median(v) for n, v in t[c].items()}
    row = c[:40].ljust(40) + "".join((f"{med[n]:.4f}" if n in med else "-").rjust(12) for n in names)
    if len(names) > 1 and names[1] in med and "main" in med:
        row += f"  {med['main'] / med[names[1]]:.3f}"
    print(row)
EOF
