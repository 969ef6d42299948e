#!/usr/bin/env bash
# Side-by-side: pagoda's CPU backend (`pagoda kernels`) vs PyTorch CPU scaled_dot_product_attention
# on the same shapes and thread counts. Builds pagoda CPU-only into build-dev, then runs
# bench/cpu_vs_torch.py, which writes a Markdown table and the raw JSON to ${OUT:-bench/results}.
#
# Dependencies: on the device machine, carry `.debs` (scripts/gpu_deps.sh fetch: PCRE2, ICU,
# SentencePiece, ..., Highway); they are unpacked with `source scripts/gpu_deps.sh env`. Otherwise,
# if the system has no libhwy-dev, the .debs in third_party/debs (apt-get download libhwy-dev
# libhwy1) are unpacked into /tmp/hwy.
# Usage: OUT=dir bench/cpu_vs_torch.sh [threads...]   (default: 2 and all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-bench/results}
mkdir -p "$OUT_DIR"

if compgen -G ".debs/libhwy-dev_*.deb" >/dev/null; then
  set +u
  # shellcheck source=/dev/null
  source scripts/gpu_deps.sh env
  set -u
elif ! pkg-config --exists libhwy 2>/dev/null; then
  if compgen -G "third_party/debs/*.deb" >/dev/null; then
    for f in third_party/debs/*.deb; do dpkg -x "$f" /tmp/hwy; done
    pc=$(find /tmp/hwy -name libhwy.pc | head -1)
    sed -i "s|^prefix=.*|prefix=/tmp/hwy/usr|" "$pc"
    export PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export CMAKE_PREFIX_PATH="/tmp/hwy/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    export LD_LIBRARY_PATH="$(dirname "$(dirname "$pc")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    echo "no Highway: install libhwy-dev or put its .debs in third_party/debs" >&2
    exit 2
  fi
fi

{ grep -m1 "model name" /proc/cpuinfo; echo "flags (SIMD):"; grep -m1 "^flags" /proc/cpuinfo |
    tr ' ' '\n' | grep -E "avx512|amx|avx2|fma" | tr '\n' ' ' || true; echo; nproc; uptime; } \
  >"$OUT_DIR/cpuinfo.txt" 2>&1 || true
cat "$OUT_DIR/cpuinfo.txt"
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=OFF \
  -DPAGODA_BUILD_TESTS=OFF -DPAGODA_BUILD_BENCH=OFF >"$OUT_DIR/build.log" 2>&1 ||
  { tail -30 "$OUT_DIR/build.log"; exit 1; }
PAGODA=build-dev/pagoda
ninja -C build-dev pagoda >>"$OUT_DIR/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$OUT_DIR/build.log" | head -20; exit 1; }
echo "build done after ${SECONDS} s"
PYTHONUNBUFFERED=1 python3 bench/cpu_vs_torch.py --pagoda "$PAGODA" --out "$OUT_DIR" --threads "$@"
echo "total ${SECONDS} s"
