# Third-party libraries, all from Debian packages (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
# SHA-256 of the hierarchical KV cache's page keys (src/pagoda/tier): Debian's libssl-dev.
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(PkgConfig REQUIRED)
pkg_check_modules(HWY IMPORTED_TARGET libhwy)
# Tokenizers (src/pagoda/tokenizer): PCRE2 regexes, ICU normalisation, SentencePiece models.
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(ICU REQUIRED IMPORTED_TARGET icu-uc)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
# `pagoda serve` (src/pagoda/server): Debian's libcpp-httplib-dev (a compiled library; its
# header's class layout depends on the OpenSSL/zlib/Brotli flags its .pc file adds). Optional:
# without it the server is not built and `pagoda serve` says so.
pkg_check_modules(HTTPLIB QUIET IMPORTED_TARGET cpp-httplib)
set(PAGODA_HAVE_HTTPLIB ${HTTPLIB_FOUND})
if(NOT HTTPLIB_FOUND)
  message(STATUS "cpp-httplib not found: `pagoda serve` is not built (apt install libcpp-httplib-dev)")
endif()
# The hierarchical KV cache's shared storage tier on Redis / Valkey (src/pagoda/tier): Debian's
# libhiredis-dev. Optional: without it `--hicache-storage redis://...` says so.
pkg_check_modules(HIREDIS QUIET IMPORTED_TARGET hiredis)
set(PAGODA_HAVE_HIREDIS ${HIREDIS_FOUND})
if(NOT HIREDIS_FOUND)
  message(STATUS "hiredis not found: the redis:// HiCache storage is not built (apt install libhiredis-dev)")
endif()
# oneDNN (Debian's libdnnl-dev): the bf16 matmul of the CPU model's --cpu-gemm onednn path
# (kernels/cpu/onednn_linear.h). Found by header and library, not by its CMake package (that one
# also requires the OpenCL headers of its GPU runtime, which pagoda does not use). Optional:
# without it --cpu-gemm onednn says so. $DNNL_ROOT (a prefix such as /tmp/sys/usr: see
# scripts/gpu_deps.sh) is searched first.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp HINTS ENV DNNL_ROOT PATH_SUFFIXES include)
find_library(DNNL_LIBRARY dnnl HINTS ENV DNNL_ROOT PATH_SUFFIXES lib/x86_64-linux-gnu lib)
if(DNNL_INCLUDE_DIR AND DNNL_LIBRARY)
  add_library(pagoda_dnnl INTERFACE IMPORTED)
  target_include_directories(pagoda_dnnl SYSTEM INTERFACE ${DNNL_INCLUDE_DIR})
  target_link_libraries(pagoda_dnnl INTERFACE ${DNNL_LIBRARY})
  set(PAGODA_HAVE_ONEDNN ON)
else()
  set(PAGODA_HAVE_ONEDNN OFF)
  message(STATUS "oneDNN not found: --cpu-gemm onednn is not built (apt install libdnnl-dev)")
endif()
set(BLA_VENDOR OpenBLAS)
find_package(BLAS)
if(PAGODA_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(PAGODA_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
