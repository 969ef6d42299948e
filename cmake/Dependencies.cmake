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
set(BLA_VENDOR OpenBLAS)
find_package(BLAS)
if(PAGODA_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(PAGODA_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
