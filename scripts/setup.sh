#!/usr/bin/env bash
# Installs missing Debian packages, then configures and builds pagoda into build/ (or $BUILD_DIR).
# Usage: ./scripts/setup.sh [TARGET ...]. With no argument it builds every target (tests and
# benchmarks included; the README's test command); with targets it builds only those, e.g.
# `./scripts/setup.sh pagoda` for the CLI and the libraries it links (the README's first command).
# Extra CMake arguments can be passed through $CMAKE_ARGS, e.g. CMAKE_ARGS="-DPAGODA_CUDA=OFF".
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config python3 libgtest-dev libgmock-dev
          libbenchmark-dev libfmt-dev libcli11-dev nlohmann-json3-dev libhwy-dev libopenblas-dev
          libomp-dev libpcre2-dev libicu-dev libsentencepiece-dev python3-pip python3-dev
          libcpp-httplib-dev libssl-dev libucx-dev libxxhash-dev libhiredis-dev redis-server
          libdnnl-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The tokenizer tests' oracles (tests/unit/tokenizer/check_against_hf.py): the `tokenizers` and
# `sentencepiece` packages, and mistral-common (6.5 MB, installed without its dependencies) for
# the real Mistral tokenizer.model it ships.
pip_install() {  # a Debian system Python refuses plain pip installs (PEP 668)
  python3 -m pip install --quiet "$@" 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages "$@"
}
python3 -c 'import tokenizers' 2>/dev/null || pip_install tokenizers
python3 -c 'import sentencepiece' 2>/dev/null || pip_install sentencepiece
python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("mistral_common") is None)' ||
  pip_install --no-deps mistral-common
# The server tests' clients and oracles (tests/unit/server): the official `openai` client,
# prometheus_client's text parser, and jinja2 for the chat templates.
python3 -c 'import openai' 2>/dev/null || pip_install openai
python3 -c 'import prometheus_client' 2>/dev/null || pip_install prometheus_client
python3 -c 'import jinja2' 2>/dev/null || pip_install jinja2
# Structured output (src/pagoda/grammar): llguidance's C API ships in its wheel's _lib.abi3.so,
# which `pagoda serve` loads at run time (with Debian's libpython3, from python3-dev); pinned
# because grammar/llg_api.h declares this version's structs. jsonschema validates the
# constrained output in the server tests (tests/unit/server/structured_checks.py).
python3 -c 'import importlib.metadata as m, sys; sys.exit(m.version("llguidance") != "1.8.0")' \
  2>/dev/null || pip_install 'llguidance==1.8.0'
python3 -c 'import jsonschema' 2>/dev/null || pip_install jsonschema
# The copy-model test (tests/unit/engine/check_copy_model.py) writes its checkpoint with
# tools/make_copy_model.py: numpy and safetensors.
python3 -c 'import numpy' 2>/dev/null || pip_install 'numpy<2.4'  # mistral-common's bound
python3 -c 'import safetensors' 2>/dev/null || pip_install safetensors
# The Python package (src/pagoda/python, python/pagoda): nanobind builds the extension, its tests
# run under pytest; scikit-build-core is what `pip install .` builds with.
python3 -c 'import nanobind' 2>/dev/null || pip_install 'nanobind>=2.4'
python3 -c 'import scikit_build_core' 2>/dev/null || pip_install 'scikit-build-core>=0.10'
python3 -c 'import pytest' 2>/dev/null || pip_install pytest

BUILD_DIR=${BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} ${CMAKE_ARGS:-} >/dev/null
# The arguments (or, equivalently, the space-separated $BUILD_TARGETS) name the targets to build.
# shellcheck disable=SC2206
targets=("$@")
((${#targets[@]})) || targets=(${BUILD_TARGETS:-})
target_args=()
((${#targets[@]})) && target_args=(--target "${targets[@]}")
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" "${target_args[@]}"
