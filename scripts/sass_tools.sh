#!/usr/bin/env bash
# cuobjdump and nvdisasm, to read SASS (tools/sass_diff.py) where the CUDA toolkit lacks them:
# PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels, unpacked under .sass-tools/
# (git-ignored), their programs linked into .sass-tools/bin (where sass_diff.py looks).
#   scripts/sass_tools.sh fetch        # SASS_TOOLS_VERSION (13.5.37) picks the wheels' version
# They read the cubins of the toolkit's nvcc 13.0 (checked 2026-12-04).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
d="$root/.sass-tools"
case "${1:-}" in
  fetch)
    version=${SASS_TOOLS_VERSION:-13.5.37}
    rm -rf "$d" && mkdir -p "$d/wheels" "$d/bin"
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$d/wheels" \
      "nvidia-cuda-cuobjdump==$version" "nvidia-cuda-nvdisasm==$version"
    for w in "$d"/wheels/*.whl; do python3 -m zipfile -e "$w" "$d/unpacked"; done
    for t in cuobjdump nvdisasm; do
      f=$(find "$d/unpacked" -name "$t" -type f | head -1)
      [ -n "$f" ] || { echo "no $t in the $version wheels" >&2; exit 1; }
      chmod +x "$f"
      ln -sf "$f" "$d/bin/$t"
    done
    "$d/bin/cuobjdump" --version | tail -1
    ;;
  *)
    echo "usage: scripts/sass_tools.sh fetch" >&2
    exit 2
    ;;
esac
