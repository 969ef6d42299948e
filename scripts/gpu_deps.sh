#!/usr/bin/env bash
# The lent H200 machine's image lacks the dev files of three Debian libraries pagoda links (PCRE2,
# ICU, SentencePiece; see cmake/Dependencies.cmake) and cannot download them. This carries them,
# and cpp-httplib for `pagoda serve` (a compiled library whose header includes OpenSSL, zlib and
# Brotli headers, so their dev packages come too), Highway (libhwy) for the CPU kernels, hiredis
# for the HiCache redis:// storage tier, oneDNN (libdnnl, and the OpenCL loader it links) for the
# CPU model's --cpu-gemm onednn, and the nanobind wheel for the Python package:
#
#   here (Debian, with apt):   scripts/gpu_deps.sh fetch      # writes .debs/ (git-ignored, ~29 MB)
#   on the GPU machine:        source scripts/gpu_deps.sh env  # unpacks to /tmp/sys, sets pkg-config
#
# then configure as usual (cmake -S . -B /tmp/b -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a). Name
# `.debs` in the device tool's `carry`. The unpacked libraries are Debian 12's; the image's newer
# glibc and libstdc++ run them.
# No `set -e`: `env` is sourced into the caller's shell.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
packages=(libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libicu-dev libicu72
          libsentencepiece-dev libsentencepiece0 libprotobuf-lite32
          libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3 zlib1g-dev libbrotli-dev libbrotli1
          libhwy-dev libhwy1 libucx-dev libucx0 libxxhash-dev libxxhash0 libnuma1 librdmacm1 libibverbs1
          libhiredis-dev libhiredis0.14 libdnnl-dev libdnnl2 ocl-icd-libopencl1)
case "${1:-}" in
  fetch)
    mkdir -p "$root/.debs"
    grep -qx '/.debs/' "$root/.git/info/exclude" 2>/dev/null || echo '/.debs/' >> "$root/.git/info/exclude"
    (cd "$root/.debs" && apt-get download "${packages[@]}") || exit 1
    # nanobind (PyPI wheel, ~0.3 MB) for the Python package (src/pagoda/python).
    python3 -m pip download --quiet --no-deps -d "$root/.debs" nanobind || exit 1
    ;;
  env)
    mkdir -p /tmp/sys
    for f in "$root"/.debs/*.deb; do dpkg -x "$f" /tmp/sys; done
    # Debian 12's hiredis.pc says libdir=/usr/lib (the library is in the multiarch folder), so
    # CMake's imported target fell back to a bare -lhiredis the linker cannot find under /tmp/sys.
    sed -i 's|^libdir=/usr/lib$|libdir=/usr/lib/x86_64-linux-gnu|' \
      /tmp/sys/usr/lib/x86_64-linux-gnu/pkgconfig/hiredis.pc 2> /dev/null
    export PKG_CONFIG_PATH=/tmp/sys/usr/lib/x86_64-linux-gnu/pkgconfig:/tmp/sys/usr/share/pkgconfig
    export PKG_CONFIG_SYSROOT_DIR=/tmp/sys PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1
    export LD_LIBRARY_PATH=/tmp/sys/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
    export DNNL_ROOT=/tmp/sys/usr  # cmake/Dependencies.cmake looks for oneDNN there first
    # The carried nanobind wheel, unpacked onto PYTHONPATH (CMake finds it through
    # `python3 -m nanobind --cmake_dir`); nothing is installed into the image's Python.
    for w in "$root"/.debs/nanobind-*.whl; do
      [ -f "$w" ] || continue
      mkdir -p /tmp/sys/py && python3 -m zipfile -e "$w" /tmp/sys/py
      export PYTHONPATH=/tmp/sys/py${PYTHONPATH:+:$PYTHONPATH}
    done
    ;;
  *)
    echo "usage: scripts/gpu_deps.sh fetch | source scripts/gpu_deps.sh env" >&2
    return 2 2>/dev/null || exit 2
    ;;
esac
