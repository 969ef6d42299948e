# Build switches (ARCHITECTURE §5).
option(PAGODA_BUILD_TESTS "Build unit, property and conformance tests" ON)
option(PAGODA_BUILD_BENCH "Build Google Benchmark micro benchmarks" ON)
option(PAGODA_BUILD_FUZZ "Build libFuzzer targets (needs clang)" OFF)
option(PAGODA_WERROR "Treat warnings as errors" OFF)
set(PAGODA_SANITIZE "" CACHE STRING "Sanitizers, e.g. address,undefined")
# Unity builds: a target's C++ sources compile in batches, so the headers that every file of a
# target includes (CLI11, the engine, GoogleTest) are parsed and code-generated once per batch: the
# CLI took 190 s of CPU as 16 translation units and 29 s as one. CI builds everything twice on
# 2 cores. Folders of CUDA sources turn it off (each kernel file is its own translation unit).
# -DPAGODA_UNITY_BUILD=OFF gives one translation unit per file (faster incremental rebuilds).
option(PAGODA_UNITY_BUILD "Compile each target's C++ sources in unity batches" ON)
set(CMAKE_UNITY_BUILD ${PAGODA_UNITY_BUILD})
set(CMAKE_UNITY_BUILD_BATCH_SIZE 16)

set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)
if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE Release CACHE STRING "Build type" FORCE)
endif()

# CUDA is optional: default ON when nvcc is found; a CPU-only build always works.
include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(_pagoda_cuda_default ON)
else()
  set(_pagoda_cuda_default OFF)
endif()
option(PAGODA_CUDA "Build CUDA platform, kernels and backends" ${_pagoda_cuda_default})
if(PAGODA_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "80;90a")
  endif()
  enable_language(CUDA)
  # CMake 3.25 does not know nvcc's C++20 flag, so it is passed directly.
  string(APPEND CMAKE_CUDA_FLAGS " -std=c++20 --expt-relaxed-constexpr")
  find_package(CUDAToolkit REQUIRED)
endif()

if(PAGODA_SANITIZE)
  add_compile_options(-fsanitize=${PAGODA_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${PAGODA_SANITIZE})
endif()
