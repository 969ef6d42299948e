#include "pagoda/core/host_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

#include "pagoda/core/error.h"

namespace pagoda {

void* allocate_host(size_t bytes, size_t alignment) {
  PAGODA_REQUIRE(alignment != 0 && (alignment & (alignment - 1)) == 0, kInvalidArgument,
                 "host allocation alignment {} is not a power of two", alignment);
  if (bytes == 0) return nullptr;
  constexpr size_t kHugePage = size_t{2} << 20;
  alignment = std::max<size_t>(alignment, alignof(std::max_align_t));
  const bool huge = bytes >= kHugeBufferBytes;
  if (huge) alignment = std::max(alignment, kHugePage);
  const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, rounded);
  PAGODA_REQUIRE(p != nullptr, kResourceExhausted, "host allocation of {} bytes failed", bytes);
  if (huge) (void)madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

}  // namespace pagoda
