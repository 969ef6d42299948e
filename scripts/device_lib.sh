# Sourced by the one-call device scripts (h200_check.sh, h200_spec.sh, h200_profile.sh):
#   device_setup NAME — results in R=/tmp/NAME_results (tarred into $OUT/NAME.tgz on exit), the
#   repo root as the working directory, gpu.txt (GPU, driver, date, $COMMIT), the carried Debian
#   packages (.debs, scripts/gpu_deps.sh) and the thread settings; B = $BUILD_DIR or /tmp/b-spec.
#   device_build TARGETS... — configures $B once (sm_90a, no benches), builds the targets.
#   device_build_tree NAME DIR JOBS TARGETS... — the same for the tree in DIR, in /tmp/b-NAME
#   (logs cfg_NAME.log / build_NAME.log in $R; prints "build NAME rc=… s"); for same-call A/Bs of
#   several trees, run in the background and waited on by pid.
#   device_sanitize TOOL SECONDS LOG BINARY ARGS... — one compute-sanitizer run (below).
# device_deps FILE — from the repo root: unpacks the carried Debian packages (.debs,
# scripts/gpu_deps.sh) into this shell's environment; without them and without PCRE2 on the
# machine nothing configures, so it says so (also into FILE) and returns 1.
device_deps() {
  if compgen -G ".debs/*.deb" > /dev/null; then  # carried: scripts/gpu_deps.sh fetch here
    # shellcheck disable=SC1091
    source scripts/gpu_deps.sh env
  elif ! pkg-config --exists libpcre2-8 2> /dev/null; then
    echo "no .debs/*.deb carried and no PCRE2 on this machine: run scripts/gpu_deps.sh fetch" \
      "here and name .debs in the device tool's carry" | tee "$1"
    return 1
  fi
}

# device_sanitize TOOL SECONDS LOG BINARY ARGS... — compute-sanitizer --tool TOOL on BINARY ARGS
# (PAGODA_REQUIRE_GPU=1: a skipped GPU test fails), its output into LOG, cut at SECONDS; prints
# "TOOL rc=N" with the run's gtest verdict and the sanitizer's summary line. Returns 1 when the
# machine has no compute-sanitizer (and says so).
device_sanitize() {
  local tool=$1 secs=$2 log=$3 san rc
  shift 3
  san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null)
  [ -n "$san" ] || { echo "$tool: no compute-sanitizer on this machine"; return 1; }
  PAGODA_REQUIRE_GPU=1 timeout "$secs" "$san" --tool "$tool" --error-exitcode 9 "$@" > "$log" 2>&1
  rc=$?
  echo "$tool rc=$rc $(grep -E '(ERROR|RACECHECK) SUMMARY|^\[  (PASSED|FAILED)' "$log" | tr '\n' ' ')"
}

device_setup() {
  OUT=${OUT:-/tmp/pagoda_out}
  R=/tmp/$1_results
  rm -rf "$R"; mkdir -p "$R" "$OUT"
  # shellcheck disable=SC2064
  trap "tar czf '$OUT/$1.tgz' -C '$R' ." EXIT
  cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    date -u +%Y-%m-%dT%H:%MZ; echo "commit ${COMMIT:-unknown}"; } | tee "$R/gpu.txt"
  device_deps "$R/error.txt" || exit 1
  export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1
  B=${BUILD_DIR:-/tmp/b-spec}
  export BUILD_DIR=$B
}

device_build() {
  if [ ! -f "$B/build.ninja" ]; then
    cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DPAGODA_BUILD_BENCH=OFF > "$R/build.log" 2>&1 \
      || { tail -40 "$R/build.log"; exit 1; }
  fi
  SECONDS=0
  timeout 420 ninja -C "$B" "$@" >> "$R/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$R/build.log" | head -40; exit 1; }
  echo "build ${SECONDS}s"
}

device_build_tree() {
  local n=$1 d=$2 j=$3; shift 3
  local t0; t0=$(date +%s)
  if [ ! -f "/tmp/b-$n/build.ninja" ]; then
    cmake -S "$d" -B "/tmp/b-$n" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DPAGODA_BUILD_BENCH=OFF > "$R/cfg_$n.log" 2>&1
  fi
  ninja -C "/tmp/b-$n" -j"$j" "$@" > "$R/build_$n.log" 2>&1
  local rc=$?
  echo "build $n rc=$rc $(( $(date +%s) - t0 )) s"
  [ $rc = 0 ] || grep -E "error|FAILED" "$R/build_$n.log" | head -20
  return $rc
}

# device_build_tree for every TREES entry "name:dir" (untracked directories of this checkout),
# in the background, with `jobs` ninja jobs and the given targets; appends the builds' pids to
# TREE_PIDS. Wait on them by pid: a bare `wait` also waits for a caller's `tee`, which never ends.
device_build_trees() {
  local j=$1 t
  shift
  for t in ${TREES:-}; do
    device_build_tree "${t%%:*}" "${t#*:}" "$j" "$@" &
    TREE_PIDS="${TREE_PIDS:-} $!"
  done
}
