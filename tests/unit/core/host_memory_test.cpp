// allocate_host (core/host_memory.h): alignment for small and huge-page buffers, every byte
// writable and freed by std::free, zero bytes, and the refusals (a non-power-of-two alignment,
// an allocation the system cannot give).
#include "pagoda/core/host_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "pagoda/core/error.h"

namespace pagoda {
namespace {

bool aligned(const void* p, size_t a) {
  return reinterpret_cast<uintptr_t>(p) % a == 0;
}

TEST(HostMemory, AlignsSmallAndHugeBuffersAndEveryByteIsUsable) {
  struct Ask {
    size_t bytes, alignment, want;
  };
  // Below kHugeBufferBytes the asked alignment (at least max_align_t's); from it on 2 MiB.
  const Ask asks[] = {{1, 1, alignof(std::max_align_t)},
                      {100, 64, 64},
                      {4096 + 3, 4096, 4096},
                      {kHugeBufferBytes - 1, 64, 64},
                      {kHugeBufferBytes, 64, size_t{2} << 20},
                      {kHugeBufferBytes + 12345, 4096, size_t{2} << 20}};
  for (const Ask& a : asks) {
    SCOPED_TRACE(::testing::Message() << a.bytes << " bytes at " << a.alignment);
    auto* p = static_cast<unsigned char*>(allocate_host(a.bytes, a.alignment));
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(aligned(p, a.want));
    std::memset(p, 0xA5, a.bytes);  // the whole request is ours (ASan sees an overrun)
    EXPECT_EQ(p[0], 0xA5);
    EXPECT_EQ(p[a.bytes - 1], 0xA5);
    std::free(p);
  }
  EXPECT_EQ(allocate_host(0, 64), nullptr);
}

TEST(HostMemory, RefusesBadAlignmentsAndImpossibleSizes) {
  for (const size_t bad : {size_t{0}, size_t{48}, size_t{3}}) {
    try {
      std::free(allocate_host(1024, bad));
      ADD_FAILURE() << "alignment " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    }
  }
#ifndef __SANITIZE_ADDRESS__  // ASan aborts on such a request instead of returning null
  try {
    std::free(allocate_host(std::numeric_limits<size_t>::max() / 2, 64));
    ADD_FAILURE() << "an allocation of half the address space succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted) << e.what();
  }
#endif
}

}  // namespace
}  // namespace pagoda
