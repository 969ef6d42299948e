#!/usr/bin/env bash
# Side-by-side: pagoda's CPU backend (`pagoda kernels`) vs PyTorch CPU scaled_dot_product_attention
# on the same shapes and thread counts. Builds pagoda CPU-only into build-dev, then runs
# bench/cpu_vs_torch.py, which writes a Markdown table and the raw JSON to ${OUT:-bench/results}.
#
# Highway: if the system has no libhwy-dev, unpack the .debs from third_party/debs
# (apt-get download libhwy-dev libhwy1) into /tmp/hwy and point pkg-config / CMake at them.
# Usage: bench/cpu_vs_torch.sh [threads...]   (default: 2 and all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-bench/results}
mkdir -p "$OUT_DIR"

if ! pkg-config --exists libhwy 2>/dev/null; then
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

cmake -S . -B build-dev -G Ninja -DPAGODA_CUDA=OFF -DPAGODA_BUILD_TESTS=OFF \
  -DPAGODA_BUILD_BENCH=OFF >"$OUT_DIR/build.log" 2>&1
PAGODA=build-dev/pagoda
if ! ninja -C build-dev pagoda >>"$OUT_DIR/build.log" 2>&1; then
  # The full CLI failed to build (another subcommand broken): build only what `kernels` needs.
  echo "full CLI build failed; building the kernels-only driver" | tee -a "$OUT_DIR/build.log"
  ninja -C build-dev pagoda_backend_cpu pagoda_backend_reference >>"$OUT_DIR/build.log" 2>&1
  L=build-dev/src/pagoda
  hwy_flags=$(pkg-config --cflags --libs libhwy)
  g++ -O2 -std=c++20 -fopenmp -DFMT_SHARED -DPAGODA_CLI_HAVE_CPU_BACKEND -DPAGODA_CLI_HAVE_BLAS \
    -Isrc bench/kernels_main.cpp src/pagoda/cli/kernels_command.cpp \
    $L/backends/cpu/libpagoda_backend_cpu.a $L/backends/reference/libpagoda_backend_reference.a \
    $L/attention/libpagoda_attention.a $L/kv/libpagoda_kv.a $L/platform/libpagoda_platform.a \
    $L/kernels/cpu/libpagoda_kernels_cpu.a $L/core/libpagoda_core.a $hwy_flags -lfmt -lopenblas \
    -o build-dev/pagoda_kernels >>"$OUT_DIR/build.log" 2>&1
  PAGODA=build-dev/pagoda_kernels
fi
PYTHONUNBUFFERED=1 python3 bench/cpu_vs_torch.py --pagoda "$PAGODA" --out "$OUT_DIR" --threads "$@"
