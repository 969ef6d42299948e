#!/usr/bin/env bash
# Builds `pagoda` (if needed) and runs scripts/hf_check.py against Hugging Face transformers.
# Usage: scripts/hf_check.sh [hf_check.py options, e.g. --backend cpu --page-size 1]
# Env: BUILD (build folder, default build-hfcheck), CMAKE_ARGS (extra configure flags).
# Exit: 0 pass, 1 mismatch, 3 torch/transformers missing (nothing compared).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD:-$ROOT/build-hfcheck}
if ! python3 -c 'import torch, transformers' >/dev/null 2>&1; then
  echo "hf_check: SKIPPED: python3 cannot import torch and transformers" \
       "(pip install torch transformers safetensors)"
  exit 3
fi
if [ ! -x "$BUILD/pagoda" ]; then
  GEN=()
  command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
  # shellcheck disable=SC2086
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DPAGODA_BUILD_TESTS=OFF \
        -DPAGODA_BUILD_BENCH=OFF ${CMAKE_ARGS:-}
  cmake --build "$BUILD" --target pagoda -j "$(nproc)"
fi
exec python3 "$ROOT/scripts/hf_check.py" --pagoda "$BUILD/pagoda" "$@"
