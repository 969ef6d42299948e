#pragma once
/// Python bindings of pagoda's memory: `KvPool` (host pools whose layers come back as NumPy
/// views, ready for BatchAttention / pagoda.flashinfer), `PageAllocator` and `RadixCache` (the
/// prefix tree over an allocator, for inspection and experiments).

#include <nanobind/nanobind.h>

namespace pagoda::python {

/// Adds KvPool, PageAllocator, RadixCache and RadixNode to `m`.
void bind_cache(nanobind::module_& m);

}  // namespace pagoda::python
