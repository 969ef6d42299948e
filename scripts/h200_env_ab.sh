#!/usr/bin/env bash
# One device call: this tree's attention kernels timed under several environments, interleaved,
# on one machine (different calls may land on different H200s whose prefill times differ by
# several percent, so only a same-call A/B shows a change of that size).
#   ENVS="name:VAR=v,VAR=v name2: ..." — the settings compared ("name:" = the defaults).
#   TESTS=1 (default) — first cuda_attention_tests, then CudaExtend.* with the sm90 consumers'
#     ping-pong forced off and on (PP_RUNS, default "0 1"), with PAGODA_REQUIRE_GPU=1.
#   REPEAT — rounds over the settings (default 2); FILTER — pagoda_cuda_bench's case filter.
#   TREES="name:dir ..." — other source trees (e.g. `git archive` of an older commit, left
#     untracked in this checkout so the device copy carries it), built beside this one and timed
#     with the defaults in every round (named columns after the settings).
#   NCU="name" — also an ncu profile (full set) of one sm90 launch at B4 S4096 under that setting.
# Builds in /tmp/b-ab (reused while the machine stays warm). Everything lands in
# $OUT/env_ab.tgz; a table of median ms per case and setting goes to stdout. COMMIT names the tree.
set -uo pipefail
OUT=${OUT:-/tmp/pagoda_out}
R=/tmp/env_ab
rm -rf "$R"; mkdir -p "$R" "$OUT"
trap 'tar czf "$OUT/env_ab.tgz" -C "$R" .' EXIT
cd "$(dirname "$0")/.." || exit 1
ENVS=${ENVS:?ENVS=\"name:VAR=v,... ...\"}
# shellcheck disable=SC1091
[ -d .debs ] && source scripts/gpu_deps.sh env
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  echo "commit ${COMMIT:-unknown}; envs: $ENVS; $(date -u +%FT%TZ)"; } | tee "$R/gpu.txt"
B=/tmp/b-ab
SECONDS=0
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DPAGODA_BUILD_BENCH=OFF > "$R/cfg.log" 2>&1 &&
  ninja -C $B pagoda_cuda_bench cuda_attention_tests > "$R/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$R/build.log" | head -30; exit 1; }
for t in ${TREES:-}; do
  (cmake -S "${t#*:}" -B "/tmp/b-ab-${t%%:*}" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=90a -DPAGODA_BUILD_BENCH=OFF > "$R/cfg_${t%%:*}.log" 2>&1 &&
   ninja -C "/tmp/b-ab-${t%%:*}" pagoda_cuda_bench > "$R/build_${t%%:*}.log" 2>&1) ||
    echo "build ${t%%:*} failed"
done
echo "build ${SECONDS}s"
if [ "${TESTS:-1}" = 1 ]; then
  PAGODA_REQUIRE_GPU=1 timeout 200 $B/tests/cuda/cuda_attention_tests > "$R/tests.log" 2>&1
  echo "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$R/tests.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|Expected|Which is|^seed|PAGODA_SM90" "$R/tests.log" | head -20
  for pp in ${PP_RUNS:-0 1}; do
    PAGODA_REQUIRE_GPU=1 PAGODA_SM90_PINGPONG=$pp timeout 150 $B/tests/cuda/cuda_attention_tests \
      --gtest_filter='CudaExtend.*' > "$R/tests_pingpong$pp.log" 2>&1
    echo "PAGODA_SM90_PINGPONG=$pp tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$R/tests_pingpong$pp.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED|Failure|Expected|Which is|^seed|PAGODA_SM90" "$R/tests_pingpong$pp.log" | head -20
  done
fi
with_env() {  # "VAR=v,VAR=v" command...
  local spec=$1; shift
  local -a kv=()
  [ -n "$spec" ] && IFS=',' read -r -a kv <<< "$spec"
  env "${kv[@]}" "$@"
}
for r in $(seq 1 "${REPEAT:-2}"); do
  for e in $ENVS; do
    with_env "${e#*:}" timeout 90 $B/tests/cuda/pagoda_cuda_bench "$R/${e%%:*}_$r.jsonl" ${FILTER:-} > /dev/null
  done
  for t in ${TREES:-}; do
    timeout 90 "/tmp/b-ab-${t%%:*}/tests/cuda/pagoda_cuda_bench" "$R/${t%%:*}_$r.jsonl" ${FILTER:-} > /dev/null
  done
done
if [ -n "${NCU:-}" ]; then
  NCUBIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  for e in $ENVS; do
    [ "${e%%:*}" = "$NCU" ] || continue
    with_env "${e#*:}" timeout 150 "$NCUBIN" --clock-control none -k regex:prefill_sm90 -c 1 --set full \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" $B/tests/cuda/pagoda_cuda_bench /tmp/ncu_case.jsonl prefill_causal_b4_s4096 \
      > "$R/ncu_$NCU.txt" 2>&1
    echo "ncu rc=$?"
  done
fi
python3 - "$R" $ENVS ${TREES:-} <<'PY'
import json, sys, glob, statistics, os
R, envs = sys.argv[1], [e.split(':')[0] for e in sys.argv[2:]]
t = {}
for n in envs:
    for f in sorted(glob.glob(f"{R}/{n}_*.jsonl")):
        for line in open(f):
            j = json.loads(line)
            t.setdefault(j["case"], {}).setdefault(n, []).append(j["ms"])
print("| case | " + " | ".join(envs) + " |")
print("|---|" + "---|" * len(envs))
for c, d in t.items():
    base = statistics.median(d[envs[0]]) if envs[0] in d else None
    cells = []
    for n in envs:
        if n not in d: cells.append("–"); continue
        m = statistics.median(d[n])
        runs = ", ".join(f"{x:.3f}" for x in d[n])
        cells.append(f"{m:.3f} ({runs})" + (f" {base / m:.2f}×" if base and n != envs[0] else ""))
    print(f"| {c} | " + " | ".join(cells) + " |")
PY
