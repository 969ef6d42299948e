#pragma once
/// Large host buffers in transparent huge pages: allocate_host(bytes, alignment) returns memory
/// aligned to `alignment` (at least alignof(max_align_t)) that std::free releases; buffers of
/// at least kHugeBufferBytes start on a 2 MiB boundary and are madvise(MADV_HUGEPAGE)d before
/// anything touches them (advisory: honoured where THP is "always" or "madvise"; elsewhere the
/// 4 KiB pages work the same). Why: a KV pool or weight matrix read in 32 KB pieces in random
/// order takes a TLB miss per 4 KiB (the CPU decode kernels lost ~20 % of their bandwidth), and
/// first-touching a buffer costs one page fault per 4 KiB (on the development VM 0.79 M fewer
/// faults were 5.9–11.9 s less system time: bench/results/cpu_bf16_weights_vm.md).
/// Throws Error(kResourceExhausted) when the allocation fails; bytes = 0 gives nullptr.

#include <cstddef>

namespace pagoda {

/// Buffers from this size on get huge pages.
inline constexpr size_t kHugeBufferBytes = size_t{4} << 20;

void* allocate_host(size_t bytes, size_t alignment);

}  // namespace pagoda
